// Fast kernels == reference kernels, bit for bit, on every SIMD path this CPU supports and on 1,
// 2 and 4 threads, over odd shapes; plus finite-difference gradient checks of the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels_internal.h"
#include "meshlearn/base/rng.h"
#include "meshlearn/engine/backend.h"
#include "meshlearn/engine/kernels.h"
#include "test_util.h"

namespace meshlearn::engine {
namespace {

using testing::AllConfigs;
using testing::BitEqual;
using testing::ConfigGuard;
using testing::RandomVec;
using Outputs = std::vector<std::vector<float>>;

// run(fast) returns every buffer the op writes. The reference result is compared with the fast
// result on every configuration.
void ExpectFastEqualsRef(const std::string& name, const std::function<Outputs(bool)>& run) {
  ConfigGuard guard;
  const Outputs want = run(false);
  for (const KernelConfig& c : AllConfigs()) {
    ASSERT_TRUE(SetKernelConfig(c).ok());
    const Outputs got = run(true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      std::string why;
      EXPECT_TRUE(BitEqual(want[i], got[i], &why))
          << name << " output " << i << " on " << SimdPathName(c.simd) << " x" << c.threads
          << " threads: " << why;
    }
  }
}

#define KERNEL(fast, Name) ((fast) ? &::meshlearn::engine::Name : &::meshlearn::engine::ref::Name)

struct LinearShape {
  int64_t B, C, OC;
};

TEST(KernelsTest, LinearForwardBackward) {
  for (LinearShape s : {LinearShape{1, 1, 1}, LinearShape{3, 5, 7}, LinearShape{13, 37, 29},
                        LinearShape{33, 300, 65}, LinearShape{70, 19, 130}, LinearShape{5, 600, 3},
                        LinearShape{130, 257, 300}, LinearShape{300, 70, 9}}) {
    for (bool with_bias : {true, false}) {
      auto inp = RandomVec(s.B * s.C, 1), w = RandomVec(s.OC * s.C, 2), b = RandomVec(s.OC, 3);
      auto dout = RandomVec(s.B * s.OC, 4);
      ExpectFastEqualsRef("LinearForward", [&](bool fast) {
        std::vector<float> out(s.B * s.OC, -7.0f);
        KERNEL(fast, LinearForward)
        (out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.B, s.C, s.OC);
        return Outputs{out};
      });
      ExpectFastEqualsRef("LinearBackward", [&](bool fast) {
        auto dinp = RandomVec(s.B * s.C, 5), dw = RandomVec(s.OC * s.C, 6), db = RandomVec(s.OC, 7);
        KERNEL(fast, LinearBackward)
        (dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
         s.B, s.C, s.OC);
        return Outputs{dinp, dw, db};
      });
    }
  }
}

// The linear layer with the ReLU fused in (after it, and before it in the backward pass) against
// the reference, which is the two ops in separate (zeroed) buffers. The input holds exact zeros
// (the mask's edge); the input gradient's buffer starts with garbage, since the kernel writes it.
TEST(KernelsTest, LinearReluFused) {
  for (LinearShape s : {LinearShape{1, 1, 1}, LinearShape{3, 5, 7}, LinearShape{13, 37, 29},
                        LinearShape{33, 300, 65}, LinearShape{70, 19, 130},
                        LinearShape{130, 257, 300}, LinearShape{64, 256, 128}}) {
    for (bool with_bias : {true, false}) {
      auto inp = RandomVec(s.B * s.C, 41), w = RandomVec(s.OC * s.C, 42), b = RandomVec(s.OC, 43);
      auto dout = RandomVec(s.B * s.OC, 44);
      for (size_t i = 0; i < inp.size(); i += 5) inp[i] = 0.0f;
      ExpectFastEqualsRef("LinearReluForward", [&](bool fast) {
        std::vector<float> out(s.B * s.OC, -7.0f);
        KERNEL(fast, LinearReluForward)
        (out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.B, s.C, s.OC);
        return Outputs{out};
      });
      ExpectFastEqualsRef("LinearReluBackward", [&](bool fast) {
        auto dinp = RandomVec(s.B * s.C, 45), dw = RandomVec(s.OC * s.C, 46),
             db = RandomVec(s.OC, 47);
        KERNEL(fast, LinearReluBackward)
        (dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
         s.B, s.C, s.OC);
        return Outputs{dinp, dw, db};
      });
    }
  }
  // Products that round to -0 (below the smallest subnormal): the chain is -0, and the ReLU's
  // input gradient, formed by adding it to zero, is +0.
  const int64_t B = 5, C = 20, OC = 300;
  auto inp = RandomVec(B * C, 48, 0.5f, 1.0f);
  const std::vector<float> w(OC * C, 1e-20f), dout(B * OC, -1e-30f);
  ExpectFastEqualsRef("LinearReluBackward, -0 chains", [&](bool fast) {
    auto dinp = RandomVec(B * C, 49);
    KERNEL(fast, LinearReluBackward)
    (dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), B, C, OC);
    for (float x : dinp) EXPECT_TRUE(x == 0.0f && !std::signbit(x)) << x;
    return Outputs{dinp};
  });
}

struct ConvShape {
  int64_t B, C, H, W, OC, KH, KW, stride, pad;
};

TEST(KernelsTest, Conv2dForwardBackward) {
  for (ConvShape s :
       {ConvShape{1, 1, 5, 5, 1, 3, 3, 1, 0}, ConvShape{2, 3, 7, 9, 5, 3, 3, 1, 1},
        ConvShape{3, 4, 11, 10, 17, 5, 5, 2, 2}, ConvShape{5, 2, 8, 8, 3, 1, 1, 1, 0},
        ConvShape{1, 6, 13, 13, 33, 3, 2, 3, 1}, ConvShape{4, 13, 9, 9, 7, 3, 3, 1, 1},
        ConvShape{3, 1, 28, 28, 16, 5, 5, 1, 2}, ConvShape{2, 5, 19, 37, 4, 3, 5, 1, 2}}) {
    const int64_t OH = (s.H + 2 * s.pad - s.KH) / s.stride + 1;
    const int64_t OW = (s.W + 2 * s.pad - s.KW) / s.stride + 1;
    auto inp = RandomVec(s.B * s.C * s.H * s.W, 11), w = RandomVec(s.OC * s.C * s.KH * s.KW, 12);
    auto bias = RandomVec(s.OC, 13), dout = RandomVec(s.B * s.OC * OH * OW, 14);
    ExpectFastEqualsRef("Conv2dForward", [&](bool fast) {
      std::vector<float> out(s.B * s.OC * OH * OW);
      KERNEL(fast, Conv2dForward)
      (out.data(), inp.data(), w.data(), bias.data(), s.B, s.C, s.H, s.W, s.OC, s.KH, s.KW,
       s.stride, s.pad);
      return Outputs{out};
    });
    ExpectFastEqualsRef("Conv2dBackward", [&](bool fast) {
      auto dinp = RandomVec(inp.size(), 15), dw = RandomVec(w.size(), 16), db = RandomVec(s.OC, 17);
      KERNEL(fast, Conv2dBackward)
      (dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.B, s.C, s.H, s.W,
       s.OC, s.KH, s.KW, s.stride, s.pad);
      return Outputs{dinp, dw, db};
    });
  }
}

// The backward kernels that write their input gradient (0 + chain) instead of adding it, against
// the reference (the accumulating kernel into a zeroed buffer): dinp starts with garbage, the
// weight and bias gradients still accumulate. Linear shapes with K = OC past the GEMM's k block
// (partials kept in dinp between blocks) and below it; convolutions on the few-channel, direct
// and GEMM (stride > 1) input-gradient paths. Then chains that round to -0, which the reference
// turns into +0.
TEST(KernelsTest, BackwardOverwrite) {
  for (LinearShape s : {LinearShape{1, 1, 1}, LinearShape{13, 37, 29}, LinearShape{70, 19, 130},
                        LinearShape{130, 257, 300}, LinearShape{64, 1568, 128}}) {
    auto inp = RandomVec(s.B * s.C, 71), w = RandomVec(s.OC * s.C, 72);
    auto dout = RandomVec(s.B * s.OC, 73);
    for (bool with_params : {true, false}) {
      ExpectFastEqualsRef("LinearBackwardOverwrite", [&](bool fast) {
        auto dinp = RandomVec(s.B * s.C, 74), dw = RandomVec(s.OC * s.C, 75),
             db = RandomVec(s.OC, 76);
        KERNEL(fast, LinearBackwardOverwrite)
        (dinp.data(), with_params ? dw.data() : nullptr, with_params ? db.data() : nullptr,
         dout.data(), inp.data(), w.data(), s.B, s.C, s.OC);
        return Outputs{dinp, dw, db};
      });
    }
  }
  for (ConvShape s :
       {ConvShape{1, 1, 5, 5, 1, 3, 3, 1, 0}, ConvShape{2, 2, 9, 11, 5, 3, 3, 1, 1},
        ConvShape{3, 4, 11, 10, 17, 5, 5, 2, 2}, ConvShape{4, 13, 9, 9, 7, 3, 3, 1, 1},
        ConvShape{2, 16, 14, 14, 32, 5, 5, 1, 2}, ConvShape{1, 6, 13, 13, 33, 3, 2, 3, 1}}) {
    const int64_t OH = (s.H + 2 * s.pad - s.KH) / s.stride + 1;
    const int64_t OW = (s.W + 2 * s.pad - s.KW) / s.stride + 1;
    auto inp = RandomVec(s.B * s.C * s.H * s.W, 77), w = RandomVec(s.OC * s.C * s.KH * s.KW, 78);
    auto dout = RandomVec(s.B * s.OC * OH * OW, 79);
    for (bool with_params : {true, false}) {
      ExpectFastEqualsRef("Conv2dBackwardOverwrite", [&](bool fast) {
        auto dinp = RandomVec(inp.size(), 80), dw = RandomVec(w.size(), 81),
             db = RandomVec(s.OC, 82);
        KERNEL(fast, Conv2dBackwardOverwrite)
        (dinp.data(), with_params ? dw.data() : nullptr, with_params ? db.data() : nullptr,
         dout.data(), inp.data(), w.data(), s.B, s.C, s.H, s.W, s.OC, s.KH, s.KW, s.stride, s.pad);
        return Outputs{dinp, dw, db};
      });
    }
  }
  // Products below the smallest subnormal round to -0, so every chain is -0 (1x1 kernels without
  // padding: no fma(0, w, acc) term turns it into +0); written as 0 + chain, +0.
  {
    const int64_t B = 5, C = 20, OC = 300;
    auto inp = RandomVec(B * C, 83);
    const std::vector<float> w(OC * C, 1e-20f), dout(B * OC, -1e-30f);
    ExpectFastEqualsRef("LinearBackwardOverwrite, -0 chains", [&](bool fast) {
      auto dinp = RandomVec(B * C, 84);
      KERNEL(fast, LinearBackwardOverwrite)
      (dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), B, C, OC);
      for (float x : dinp) EXPECT_TRUE(x == 0.0f && !std::signbit(x)) << x;
      return Outputs{dinp};
    });
  }
  for (int64_t C : {1, 2, 16}) {
    const int64_t B = 2, H = 5, W = 9, OC = 7;
    auto inp = RandomVec(B * C * H * W, 85);
    const std::vector<float> w(OC * C, 1e-20f), dout(B * OC * H * W, -1e-30f);
    ExpectFastEqualsRef("Conv2dBackwardOverwrite, -0 chains", [&](bool fast) {
      auto dinp = RandomVec(inp.size(), 86);
      KERNEL(fast, Conv2dBackwardOverwrite)
      (dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), B, C, H, W, OC, 1, 1, 1,
       0);
      for (float x : dinp) EXPECT_TRUE(x == 0.0f && !std::signbit(x)) << x;
      return Outputs{dinp};
    });
  }
}

// The element-wise backward kernels that write their input gradient (0 + ...) instead of adding
// it, against the reference (the accumulating kernel into a zeroed buffer): outputs start with
// garbage, lengths around the vector width and past the threading threshold, GELU inputs at its
// edges (+-0, large, tiny) and gradients of -0 (written as +0).
TEST(KernelsTest, ElementwiseBackwardOverwrite) {
  const float edges[] = {0.0f, -0.0f, 12.0f, -12.0f, 1e-30f, -1e-30f, 5e3f, -5e3f};
  for (int64_t n : {1, 15, 16, 17, 1000, 70000}) {
    auto dout = RandomVec(n, 109);
    for (int64_t i = 0; i < n; i += 3) dout[i] = -0.0f;
    auto inp = RandomVec(n, 112, -4.0f, 4.0f);
    for (int64_t i = 0; i < n; i += 7) inp[i] = edges[(i / 7) % 8];
    ExpectFastEqualsRef("GeluBackwardOverwrite", [&](bool fast) {
      auto dinp = RandomVec(n, 113);
      KERNEL(fast, GeluBackwardOverwrite)(dinp.data(), dout.data(), inp.data(), n);
      return Outputs{dinp};
    });
    for (bool with_db : {true, false}) {
      ExpectFastEqualsRef("ResidualBackwardOverwrite", [&](bool fast) {
        auto da = RandomVec(n, 110), db = RandomVec(n, 111);
        KERNEL(fast, ResidualBackwardOverwrite)
        (da.data(), with_db ? db.data() : nullptr, dout.data(), n);
        for (float x : da) EXPECT_FALSE(x == 0.0f && std::signbit(x));
        return Outputs{da, db};
      });
    }
  }
}

// The convolution with the ReLU after it fused into its epilogue, against the reference (the two
// ops), on the direct (stride 1) and the GEMM paths. One output channel has zero weights and bias
// -0, so its outputs are +0 and -0 (the ReLU's edge; both become +0).
TEST(KernelsTest, Conv2dReluFused) {
  for (ConvShape s :
       {ConvShape{1, 1, 5, 5, 1, 3, 3, 1, 0}, ConvShape{2, 3, 7, 9, 5, 3, 3, 1, 1},
        ConvShape{3, 4, 11, 10, 17, 5, 5, 2, 2}, ConvShape{1, 6, 13, 13, 33, 3, 2, 3, 1},
        ConvShape{3, 1, 28, 28, 16, 5, 5, 1, 2}, ConvShape{2, 16, 14, 14, 32, 5, 5, 1, 2}}) {
    const int64_t OH = (s.H + 2 * s.pad - s.KH) / s.stride + 1;
    const int64_t OW = (s.W + 2 * s.pad - s.KW) / s.stride + 1;
    const int64_t K = s.C * s.KH * s.KW;
    auto inp = RandomVec(s.B * s.C * s.H * s.W, 51), w = RandomVec(s.OC * K, 52);
    auto bias = RandomVec(s.OC, 53);
    const int64_t zero_oc = s.OC / 2;
    for (int64_t k = 0; k < K; ++k) w[zero_oc * K + k] = 0.0f;
    bias[zero_oc] = -0.0f;
    for (bool with_bias : {true, false}) {
      ExpectFastEqualsRef("Conv2dReluForward", [&](bool fast) {
        std::vector<float> out(s.B * s.OC * OH * OW, -7.0f);
        KERNEL(fast, Conv2dReluForward)
        (out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.B, s.C, s.H, s.W,
         s.OC, s.KH, s.KW, s.stride, s.pad);
        for (float x : out) EXPECT_TRUE(x > 0.0f || (x == 0.0f && !std::signbit(x))) << x;
        return Outputs{out};
      });
    }
  }
}

TEST(KernelsTest, MaxPool) {
  struct Case {
    int64_t k, st, H, W;
  };
  // 2x2 at stride 2 has its own path: rows of 4, 7 (one partial vector), 14, 35 outputs.
  for (auto [k, st, H, W] :
       {Case{2, 2, 11, 9}, Case{3, 2, 11, 9}, Case{3, 1, 11, 9}, Case{2, 2, 28, 28},
        Case{2, 2, 14, 14}, Case{2, 2, 9, 70}, Case{3, 1, 7, 37}, Case{2, 2, 2, 3}}) {
    const int64_t B = 3, C = 5, OH = (H - k) / st + 1, OW = (W - k) / st + 1;
    auto inp = RandomVec(B * C * H * W, 21);
    for (size_t i = 0; i < inp.size(); i += 7) inp[i] = 0.5f;  // ties
    // NaNs: skipped unless first in their window.
    for (size_t i = 3; i < inp.size(); i += 29) inp[i] = std::nanf("");
    auto dout = RandomVec(B * C * OH * OW, 22);
    ExpectFastEqualsRef("MaxPool2d", [&](bool fast) {
      std::vector<float> out(B * C * OH * OW);
      std::vector<int32_t> am(out.size());
      KERNEL(fast, MaxPool2dForward)(out.data(), am.data(), inp.data(), B, C, H, W, k, st);
      auto dinp = RandomVec(inp.size(), 23);
      KERNEL(fast, MaxPool2dBackward)(dinp.data(), dout.data(), am.data(), B, C, OH, OW);
      std::vector<float> amf(am.begin(), am.end());
      return Outputs{out, amf, dinp};
    });
  }
}

// The max pool's backward with the ReLU before it folded in, against the reference (the two ops in
// zeroed buffers, and the bias gradient of a convolution whose output gradient that is),
// overlapping windows included, channel counts below, at and past the bias groups of 8. The
// input is a ReLU's output (exact zeros, ties at 0 among them) on half the cases and any sign on
// the others; some gradients are -0, which the two ops turn into +0; dinp starts with garbage,
// since the kernel writes it.
TEST(KernelsTest, MaxPoolReluFused) {
  struct Case {
    int64_t k, st, H, W, C;
  };
  for (auto [k, st, H, W, C] :
       {Case{2, 2, 11, 9, 5}, Case{3, 2, 11, 9, 5}, Case{3, 1, 11, 9, 5}, Case{2, 2, 28, 28, 16},
        Case{2, 2, 14, 14, 19}, Case{3, 1, 7, 37, 3}}) {
    for (bool relu_input : {true, false}) {
      const int64_t B = 3, OH = (H - k) / st + 1, OW = (W - k) / st + 1;
      auto inp = RandomVec(B * C * H * W, 61);
      if (relu_input) {
        for (float& x : inp) x = x > 0.0f ? x : 0.0f;
      }
      auto dout = RandomVec(B * C * OH * OW, 62);
      for (size_t i = 0; i < dout.size(); i += 5) dout[i] = -0.0f;
      std::vector<float> pooled(B * C * OH * OW);
      std::vector<int32_t> am(pooled.size());
      ref::MaxPool2dForward(pooled.data(), am.data(), inp.data(), B, C, H, W, k, st);
      // The mask comes from the pool's output: the reference with it equals the two ops masking
      // with the pool's input.
      {
        std::vector<float> two_ops(inp.size(), 0.0f), pool_dinp(inp.size(), 0.0f);
        ref::MaxPool2dBackward(pool_dinp.data(), dout.data(), am.data(), B, C, OH, OW);
        ref::ReluBackward(two_ops.data(), pool_dinp.data(), inp.data(), B * C * H * W);
        auto fused = RandomVec(inp.size(), 63);
        ref::MaxPool2dReluBackward(fused.data(), nullptr, dout.data(), am.data(), pooled.data(), B,
                                   C, H, W, OH, OW);
        std::string why;
        EXPECT_TRUE(BitEqual(two_ops, fused, &why))
            << "k=" << k << " st=" << st << " relu_input=" << relu_input << ": " << why;
      }
      for (bool with_bias : {true, false}) {
        ExpectFastEqualsRef("MaxPool2dReluBackward", [&](bool fast) {
          auto dinp = RandomVec(inp.size(), 63), db = RandomVec(C, 64);
          KERNEL(fast, MaxPool2dReluBackward)
          (dinp.data(), with_bias ? db.data() : nullptr, dout.data(), am.data(), pooled.data(), B,
           C, H, W, OH, OW);
          for (float x : dinp) EXPECT_FALSE(x == 0.0f && std::signbit(x));
          return Outputs{dinp, db};
        });
      }
    }
  }
}

TEST(KernelsTest, ElementWise) {
  for (int64_t n : {1, 7, 16, 33, 1000, 40001, 200003}) {
    auto x = RandomVec(n, 31, -6.0f, 6.0f), g = RandomVec(n, 32), y = RandomVec(n, 33);
    x[0] = 0.0f;
    ExpectFastEqualsRef("Relu", [&](bool fast) {
      std::vector<float> out(n);
      auto d = RandomVec(n, 34);
      KERNEL(fast, ReluForward)(out.data(), x.data(), n);
      KERNEL(fast, ReluBackward)(d.data(), g.data(), x.data(), n);
      return Outputs{out, d};
    });
    ExpectFastEqualsRef("Gelu", [&](bool fast) {
      std::vector<float> out(n);
      auto d = RandomVec(n, 35);
      KERNEL(fast, GeluForward)(out.data(), x.data(), n);
      KERNEL(fast, GeluBackward)(d.data(), g.data(), x.data(), n);
      return Outputs{out, d};
    });
    ExpectFastEqualsRef("Residual", [&](bool fast) {
      std::vector<float> out(n);
      auto da = RandomVec(n, 36), db = RandomVec(n, 37);
      KERNEL(fast, ResidualForward)(out.data(), x.data(), y.data(), n);
      KERNEL(fast, ResidualBackward)(da.data(), db.data(), g.data(), n);
      return Outputs{out, da, db};
    });
    ExpectFastEqualsRef("Dropout", [&](bool fast) {
      std::vector<float> out(n), mask(n);
      auto d = RandomVec(n, 38);
      KERNEL(fast, DropoutForward)(out.data(), mask.data(), x.data(), n, 0.3f, 0x1234567890ull, 77);
      KERNEL(fast, DropoutBackward)(d.data(), g.data(), mask.data(), n);
      return Outputs{out, mask, d};
    });
    // AdamW: with and without clipping and weight decay; v >= 0 as in training, tiny values too.
    for (int variant = 0; variant < 4; ++variant) {
      ExpectFastEqualsRef("AdamW", [&](bool fast) {
        auto w = RandomVec(n, 40), gr = RandomVec(n, 41), m = RandomVec(n, 42, -0.1f, 0.1f);
        auto v = RandomVec(n, 43, 0.0f, 1e-3f);
        v[0] = 0.0f;
        gr[0] = 0.0f;
        AdamWStep s;
        s.b1 = 0.9f;
        s.b2 = 0.99f;
        s.one_minus_b1 = 0.1f;
        s.one_minus_b2 = 0.01f;
        s.step_size = 1e-3f / 0.19f;
        s.bc2_sqrt = 0.141f;
        s.eps = 1e-8f;
        s.decay = 0.9999f;
        s.grad_scale = 0.37f;
        s.decay_weight = variant & 1;
        s.scale_grad = variant & 2;
        for (int step = 0; step < 2; ++step) {
          KERNEL(fast, AdamWUpdate)(w.data(), gr.data(), m.data(), v.data(), n, s);
        }
        return Outputs{w, gr, m, v};
      });
    }
    ExpectFastEqualsRef("SumTree", [&](bool fast) {
      float a = KERNEL(fast, SumTree)(x.data(), n);
      float b = KERNEL(fast, SumSquaresTree)(x.data(), n);
      return Outputs{{a, b}};
    });
  }
}

TEST(KernelsTest, SumTreeLong) {
  for (int64_t n : {1024, 1025, 8 * 1024, 9 * 1024 + 5, 100003}) {
    auto x = RandomVec(n, 41);
    ExpectFastEqualsRef("SumTree", [&](bool fast) {
      return Outputs{
          {KERNEL(fast, SumTree)(x.data(), n), KERNEL(fast, SumSquaresTree)(x.data(), n)}};
    });
  }
}

// SumSquaresBlocks is SumSquaresTree's first half: the same partials on every path, and the tree
// over them is SumSquaresTree's bits.
TEST(KernelsTest, SumSquaresBlocksAreTheTreesBlocks) {
  for (int64_t n : {1, 1023, 1024, 1025, 8 * 1024, 9 * 1024 + 5, 100003}) {
    auto x = RandomVec(n, 43);
    const int64_t nb = (n + kSumBlock - 1) / kSumBlock;
    ExpectFastEqualsRef("SumSquaresBlocks", [&](bool fast) {
      std::vector<float> p(static_cast<size_t>(nb) + 1, -7.0f);  // one past the end: untouched
      KERNEL(fast, SumSquaresBlocks)(x.data(), n, p.data());
      return Outputs{p};
    });
    std::vector<float> p(static_cast<size_t>(nb));
    SumSquaresBlocks(x.data(), n, p.data());
    EXPECT_EQ(std::bit_cast<uint32_t>(internal::CombinePartialsTree(p.data(), nb)),
              std::bit_cast<uint32_t>(SumSquaresTree(x.data(), n)))
        << "n=" << n;
  }
}

TEST(KernelsTest, SoftmaxCrossEntropy) {
  for (auto [B, V] : {std::pair<int64_t, int64_t>{1, 1}, {5, 10}, {7, 33}, {64, 10}, {3, 1001}}) {
    auto logits = RandomVec(B * V, 51, -8.0f, 8.0f);
    std::vector<int32_t> targets(B);
    for (int64_t b = 0; b < B; ++b) targets[b] = static_cast<int32_t>((b * 7 + 3) % V);
    ExpectFastEqualsRef("SoftmaxCE", [&](bool fast) {
      std::vector<float> probs(B * V), losses(B);
      float loss = KERNEL(fast, SoftmaxCrossEntropyForward)(probs.data(), losses.data(),
                                                            logits.data(), targets.data(), B, V);
      auto d = RandomVec(B * V, 52);
      KERNEL(fast, SoftmaxCrossEntropyBackward)(d.data(), probs.data(), targets.data(), 0.7f, B, V);
      return Outputs{probs, losses, {loss}, d};
    });
  }
}

TEST(KernelsTest, LayerNorm) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 33}, {64, 200}}) {
    auto x = RandomVec(N * C, 61, -3.0f, 3.0f), w = RandomVec(C, 62), b = RandomVec(C, 63);
    auto g = RandomVec(N * C, 64);
    ExpectFastEqualsRef("LayerNorm", [&](bool fast) {
      std::vector<float> out(N * C), mean(N), rstd(N);
      KERNEL(fast, LayerNormForward)
      (out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      auto dx = RandomVec(N * C, 65), dw = RandomVec(C, 66), db = RandomVec(C, 67);
      KERNEL(fast, LayerNormBackward)
      (dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
       C);
      return Outputs{out, mean, rstd, dx, dw, db};
    });
  }
}

TEST(KernelsTest, Embedding) {
  const int64_t N = 37, C = 19, V = 11;
  auto table = RandomVec(V * C, 71), g = RandomVec(N * C, 72);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = static_cast<int32_t>((n * n + 3) % (V - 2));  // some unused
  ExpectFastEqualsRef("Embedding", [&](bool fast) {
    std::vector<float> out(N * C);
    KERNEL(fast, EmbeddingForward)(out.data(), ids.data(), table.data(), N, C);
    auto dt = RandomVec(V * C, 73);
    KERNEL(fast, EmbeddingBackward)(dt.data(), g.data(), ids.data(), N, C, V);
    return Outputs{out, dt};
  });
}

TEST(KernelsTest, Attention) {
  struct S {
    int64_t B, T, C, NH;
  };
  for (S s : {S{1, 1, 4, 1}, S{2, 5, 12, 3}, S{2, 17, 40, 4}, S{1, 40, 64, 2}, S{2, 64, 32, 2}}) {
    auto qkv = RandomVec(s.B * s.T * 3 * s.C, 81, -2.0f, 2.0f), g = RandomVec(s.B * s.T * s.C, 82);
    ExpectFastEqualsRef("Attention", [&](bool fast) {
      const int64_t TT = s.B * s.NH * s.T * s.T;
      std::vector<float> out(s.B * s.T * s.C), pre(TT, 9.0f), att(TT, 9.0f);
      KERNEL(fast, AttentionForward)
      (out.data(), pre.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      auto dqkv = RandomVec(qkv.size(), 83);
      std::vector<float> dpre(TT, 5.0f), datt(TT, 5.0f);
      KERNEL(fast, AttentionBackward)
      (dqkv.data(), dpre.data(), datt.data(), g.data(), qkv.data(), att.data(), s.B, s.T, s.C,
       s.NH);
      return Outputs{out, pre, att, dqkv, dpre, datt};
    });
  }
}

// The fast attention skips the masked terms of its chains where that keeps the reference's bits
// (kernels_impl.h, "Attention"). Each case makes a skipped term matter: a non-finite factor (0 *
// Inf is NaN), a nonzero masked att entry passed to the backward, or a chain that ends at -0 before
// its masked terms (an underflowing product), which a masked +0 * x with x >= 0 turns into +0.
TEST(KernelsTest, AttentionMaskedTermsKeepTheReferenceBits) {
  struct S {
    int64_t B, T, C, NH;
  };
  const float kInf = std::numeric_limits<float>::infinity();
  const float kTiny = -std::numeric_limits<float>::denorm_min();
  for (S s : {S{2, 40, 64, 2}, S{1, 300, 32, 1}}) {
    const int64_t hs = s.C / s.NH, C3 = 3 * s.C, N = s.B * s.T;
    for (int which = 0; which < 8; ++which) {
      auto qkv = RandomVec(N * C3, 91, -2.0f, 2.0f), g = RandomVec(N * s.C, 92);
      auto dqkv0 = RandomVec(qkv.size(), 93);
      bool upper_nonzero = false;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t t = n % s.T;
        for (int64_t h = 0; h < s.NH; ++h) {
          float* q = &qkv[n * C3 + h * hs];
          float* k = q + s.C;
          float* v = q + 2 * s.C;
          switch (which) {
            case 0:  // v's last row infinite: the reference's out is NaN in every row
              if (t == s.T - 1) v[1] = kInf;
              break;
            case 1:  // out's chains end at -0 in the first rows; the masked v are positive
              v[0] = t < s.T / 2 ? kTiny : 1.0f;
              break;
            case 2:  // dout's first row infinite: every dv row's chain starts with 0 * Inf
              if (t == 0) g[n * s.C + h * hs + 2] = kInf;
              break;
            case 3:  // q's first row NaN: every dk row's chain starts with 0 * NaN
              if (t == 0) q[3] = std::numeric_limits<float>::quiet_NaN();
              break;
            case 4:  // att's masked entries nonzero in the backward's input (below)
              upper_nonzero = true;
              break;
            case 5:  // dq's chains end at -0 onto a -0 dq; the masked k are positive
              k[0] = t < s.T / 2 ? kTiny : 1.0f;
              dqkv0[n * C3 + h * hs] = -0.0f;
              for (int64_t i = 0; i < hs; ++i) g[n * s.C + h * hs + i] *= 1e-3f;
              break;
            case 6:  // k's last row infinite: dq's chains end with 0 * Inf
              if (t == s.T - 1) k[4] = -kInf;
              break;
            case 7:  // the softmax backward's row sums end at -0 (dA = dout . v underflows, to
                     // -0 where v < 0.5); its masked terms turn them into +0, and dA - s then
                     // differs in sign where dA is -0
              v[hs - 1] = t % 2 == 0 ? 0.75f : 0.25f;
              for (int64_t i = 0; i < hs; ++i) g[n * s.C + h * hs + i] = i == hs - 1 ? kTiny : 0.0f;
              break;
          }
        }
      }
      ExpectFastEqualsRef("AttentionMasked" + std::to_string(which), [&](bool fast) {
        const int64_t TT = s.B * s.NH * s.T * s.T;
        std::vector<float> out(N * s.C), pre(TT, 9.0f), att(TT, 9.0f);
        KERNEL(fast, AttentionForward)
        (out.data(), pre.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        std::vector<float> att_in = att;
        if (upper_nonzero) {
          for (int64_t r = 0; r < s.B * s.NH * s.T; ++r)
            for (int64_t t2 = r % s.T + 1; t2 < s.T; ++t2) att_in[r * s.T + t2] = 0.25f;
        }
        auto dqkv = dqkv0;
        std::vector<float> dpre(TT, 5.0f), datt(TT, 5.0f);
        KERNEL(fast, AttentionBackward)
        (dqkv.data(), dpre.data(), datt.data(), g.data(), qkv.data(), att_in.data(), s.B, s.T, s.C,
         s.NH);
        return Outputs{out, pre, att, dqkv, dpre, datt};
      });
    }
  }
}

// ---- Finite-difference gradient checks of the reference kernels --------------------------------
//
// loss = sum(out * R) in double; the analytic gradient comes from the backward kernel with
// dout = R; the numerical one from central differences of the float forward.

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void CheckGrad(const std::string& name, std::vector<float>* param, const std::vector<float>& grad,
               const std::function<double()>& loss, float eps, double tol) {
  for (size_t j = 0; j < param->size(); j += 1 + param->size() / 23) {
    const float saved = (*param)[j];
    (*param)[j] = saved + eps;
    const double lp = loss();
    (*param)[j] = saved - eps;
    const double lm = loss();
    (*param)[j] = saved;
    const double num = (lp - lm) / (2.0 * static_cast<double>(eps));
    EXPECT_NEAR(num, grad[j], tol * (1.0 + std::fabs(num))) << name << " index " << j;
  }
}

TEST(GradCheckTest, Linear) {
  const int64_t B = 4, C = 6, OC = 5;
  auto inp = RandomVec(B * C, 1), w = RandomVec(OC * C, 2), b = RandomVec(OC, 3),
       R = RandomVec(B * OC, 4);
  auto loss = [&] {
    std::vector<float> out(B * OC);
    ref::LinearForward(out.data(), inp.data(), w.data(), b.data(), B, C, OC);
    return Dot(out, R);
  };
  std::vector<float> di(inp.size()), dw(w.size()), db(b.size());
  ref::LinearBackward(di.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), B, C, OC);
  CheckGrad("inp", &inp, di, loss, 1e-2f, 1e-3);
  CheckGrad("weight", &w, dw, loss, 1e-2f, 1e-3);
  CheckGrad("bias", &b, db, loss, 1e-2f, 1e-3);
}

TEST(GradCheckTest, Conv2d) {
  const int64_t B = 2, C = 3, H = 7, W = 6, OC = 4, K = 3, s = 2, p = 1;
  const int64_t OH = (H + 2 * p - K) / s + 1, OW = (W + 2 * p - K) / s + 1;
  auto inp = RandomVec(B * C * H * W, 1), w = RandomVec(OC * C * K * K, 2), b = RandomVec(OC, 3);
  auto R = RandomVec(B * OC * OH * OW, 4);
  auto loss = [&] {
    std::vector<float> out(R.size());
    ref::Conv2dForward(out.data(), inp.data(), w.data(), b.data(), B, C, H, W, OC, K, K, s, p);
    return Dot(out, R);
  };
  std::vector<float> di(inp.size()), dw(w.size()), db(b.size());
  ref::Conv2dBackward(di.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), B, C, H, W,
                      OC, K, K, s, p);
  CheckGrad("inp", &inp, di, loss, 1e-2f, 1e-3);
  CheckGrad("weight", &w, dw, loss, 1e-2f, 1e-3);
  CheckGrad("bias", &b, db, loss, 1e-2f, 1e-3);
}

TEST(GradCheckTest, GeluLayerNormSoftmax) {
  const int64_t N = 3, C = 8;
  auto x = RandomVec(N * C, 1, -3, 3), w = RandomVec(C, 2), b = RandomVec(C, 3),
       R = RandomVec(N * C, 4);
  {
    auto loss = [&] {
      std::vector<float> out(N * C);
      ref::GeluForward(out.data(), x.data(), N * C);
      return Dot(out, R);
    };
    std::vector<float> dx(x.size());
    ref::GeluBackward(dx.data(), R.data(), x.data(), N * C);
    CheckGrad("gelu", &x, dx, loss, 1e-3f, 2e-3);
  }
  {
    auto loss = [&] {
      std::vector<float> out(N * C), m(N), r(N);
      ref::LayerNormForward(out.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
      return Dot(out, R);
    };
    std::vector<float> out(N * C), m(N), r(N), dx(x.size()), dw(C), db(C);
    ref::LayerNormForward(out.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
    ref::LayerNormBackward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), m.data(),
                           r.data(), N, C);
    CheckGrad("layernorm x", &x, dx, loss, 1e-3f, 5e-3);
    CheckGrad("layernorm w", &w, dw, loss, 1e-3f, 5e-3);
    CheckGrad("layernorm b", &b, db, loss, 1e-3f, 5e-3);
  }
  {
    std::vector<int32_t> t = {1, 7, 0};
    auto loss = [&] {
      std::vector<float> probs(N * C), l(N);
      return static_cast<double>(
          ref::SoftmaxCrossEntropyForward(probs.data(), l.data(), x.data(), t.data(), N, C));
    };
    std::vector<float> probs(N * C), l(N), dx(x.size());
    ref::SoftmaxCrossEntropyForward(probs.data(), l.data(), x.data(), t.data(), N, C);
    ref::SoftmaxCrossEntropyBackward(dx.data(), probs.data(), t.data(), 1.0f, N, C);
    CheckGrad("softmax", &x, dx, loss, 1e-2f, 5e-3);
  }
}

TEST(GradCheckTest, Attention) {
  const int64_t B = 1, T = 4, C = 6, NH = 2;
  auto qkv = RandomVec(B * T * 3 * C, 1), R = RandomVec(B * T * C, 2);
  auto loss = [&] {
    std::vector<float> out(B * T * C), pre(B * NH * T * T), att(pre.size());
    ref::AttentionForward(out.data(), pre.data(), att.data(), qkv.data(), B, T, C, NH);
    return Dot(out, R);
  };
  std::vector<float> out(B * T * C), pre(B * NH * T * T), att(pre.size()), dpre(pre.size()),
      datt(pre.size()), dqkv(qkv.size());
  ref::AttentionForward(out.data(), pre.data(), att.data(), qkv.data(), B, T, C, NH);
  ref::AttentionBackward(dqkv.data(), dpre.data(), datt.data(), R.data(), qkv.data(), att.data(), B,
                         T, C, NH);
  CheckGrad("qkv", &qkv, dqkv, loss, 1e-2f, 5e-3);
}

TEST(BackendTest, ParseAndSet) {
  ConfigGuard guard;
  EXPECT_TRUE(ParseSimdPath("auto").ok());
  EXPECT_FALSE(ParseSimdPath("sse9").ok());
  EXPECT_FALSE(SetKernelConfig(KernelConfig{SimdPath::kScalar, 0}).ok());
  EXPECT_TRUE(SetKernelConfig(KernelConfig{SimdPath::kScalar, 3}).ok());
  EXPECT_EQ(GetKernelConfig().threads, 3);
}

}  // namespace
}  // namespace meshlearn::engine

namespace meshlearn::engine {
namespace {

// The dropout mask is the documented pure function of (i, seed, stream), so a verifier can
// recompute any element without running the op.
TEST(KernelsTest, DropoutMaskIsThePhiloxFormula) {
  const int64_t n = 1000;
  const uint64_t seed = 0xfeedface12345678ull, stream = (7ull << 32) | 9;
  const float p = 0.25f;
  std::vector<float> x(n, 2.0f), out(n), mask(n);
  DropoutForward(out.data(), mask.data(), x.data(), n, p, seed, stream);
  int kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto r = Philox4x32({static_cast<uint32_t>(i), 0u, 9u, 7u}, {0x12345678u, 0xfeedfaceu});
    const bool keep = U32ToUnitFloat(r[0]) >= p;
    EXPECT_EQ(mask[i], keep ? 1.0f / (1.0f - p) : 0.0f) << i;
    EXPECT_EQ(out[i], 2.0f * mask[i]) << i;
    kept += keep;
  }
  EXPECT_GT(kept, 650);
  EXPECT_LT(kept, 850);
}

}  // namespace
}  // namespace meshlearn::engine

#if defined(__x86_64__)
#include <xmmintrin.h>

namespace meshlearn::engine {
namespace {

// A caller that enabled flush-to-zero / denormals-are-zero (as some libraries do) must not change
// kernel results: the kernels run under the canonical MXCSR and restore the caller's.
TEST(KernelsTest, FlushToZeroModeDoesNotChangeResults) {
  testing::ConfigGuard guard;
  const int64_t B = 9, C = 37, OC = 40;
  auto inp = RandomVec(B * C, 1), w = RandomVec(OC * C, 2);
  for (auto& x : inp) x *= 1e-37f;  // products and sums are subnormal
  std::vector<float> want(B * OC), got(B * OC);
  ref::LinearForward(want.data(), inp.data(), w.data(), nullptr, B, C, OC);
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  for (const KernelConfig& c : AllConfigs()) {
    ASSERT_TRUE(SetKernelConfig(c).ok());
    LinearForward(got.data(), inp.data(), w.data(), nullptr, B, C, OC);
    std::string why;
    EXPECT_TRUE(BitEqual(want, got, &why))
        << SimdPathName(c.simd) << " x" << c.threads << ": " << why;
    EXPECT_EQ(_mm_getcsr() & 0xFFC0, (saved | 0x8040) & 0xFFC0) << "caller's MXCSR not restored";
  }
  _mm_setcsr(saved);
}

}  // namespace
}  // namespace meshlearn::engine
#endif
