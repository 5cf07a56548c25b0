// Internal: the engine's transcendental functions, written once over Vf (simd.h) so the scalar,
// AVX2 and AVX-512 builds execute the same sequence of IEEE operations and give the same bits.
// Define MESHLEARN_SIMD_LEVEL / MESHLEARN_SIMD_NS first (see simd.h); include outside any namespace.
//
// The algorithms are Cephes-style: argument reduction, then a fixed polynomial evaluated by
// Horner's rule with explicit fused multiply-adds. Accuracy (measured by math_test over sweeps
// against double-precision libm): see math.h.
#pragma once

#include "simd.h"

namespace meshlearn::engine::MESHLEARN_SIMD_NS {

inline Vf Inf() { return Set1(__builtin_inff()); }
inline Vf QuietNan() { return Set1(__builtin_nanf("")); }

// e^x. Overflow (x > 88.7228394) gives +inf, x < -103.972084 gives 0 (subnormal results are
// produced by one final rounding), NaN propagates.
inline Vf ExpV(Vf x) {
  const Mask nan = IsNan(x);
  const Mask over = Gt(x, Set1(88.72283935546875f));
  const Mask under = Lt(x, Set1(-103.972084045410156f));
  const Vf xc = Select(Or(Or(nan, over), under), Zero(), x);
  const Vf magic = Set1(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const Vf n = Fma(xc, Set1(1.44269504088896341f), magic) - magic;
  // Cody-Waite: r = x - n*ln2 with ln2 split in two.
  Vf r = Fma(n, Set1(-0.693359375f), xc);
  r = Fma(n, Set1(2.12194440e-4f), r);
  Vf p = Set1(1.9875691500e-4f);
  p = Fma(p, r, Set1(1.3981999507e-3f));
  p = Fma(p, r, Set1(8.3334519073e-3f));
  p = Fma(p, r, Set1(4.1665795894e-2f));
  p = Fma(p, r, Set1(1.6666665459e-1f));
  p = Fma(p, r, Set1(5.0000001201e-1f));
  Vf y = Fma(p, r * r, r) + Set1(1.0f);
  // 2^n as two factors so n in [-150, 128] never leaves the normal exponent range.
  const Vf n1 = Fma(n, Set1(0.5f), magic) - magic;
  const Vf n2 = n - n1;
  y = (y * Pow2Int(n1)) * Pow2Int(n2);
  y = Select(over, Inf(), y);
  y = Select(under, Zero(), y);
  return Select(nan, x, y);
}

// Natural log. x < 0 or NaN gives NaN, 0 gives -inf, +inf gives +inf; subnormals are exact.
inline Vf LogV(Vf x) {
  const Mask nan = Or(IsNan(x), Lt(x, Zero()));
  const Mask zero = Eq(x, Zero());
  const Mask inf = Eq(x, Inf());
  const Mask sub = Lt(x, Set1(1.17549435e-38f));
  Vf xs = Select(sub, x * Set1(8388608.0f), x);  // 2^23
  xs = Select(Or(nan, Or(zero, inf)), Set1(1.0f), xs);
  Vf m, e;
  Frexp(xs, &m, &e);
  e = Select(sub, e - Set1(23.0f), e);
  const Mask small = Lt(m, Set1(0.707106781186547524f));
  e = Select(small, e - Set1(1.0f), e);
  m = Select(small, (m + m) - Set1(1.0f), m - Set1(1.0f));
  const Vf z = m * m;
  Vf p = Set1(7.0376836292e-2f);
  p = Fma(p, m, Set1(-1.1514610310e-1f));
  p = Fma(p, m, Set1(1.1676998740e-1f));
  p = Fma(p, m, Set1(-1.2420140846e-1f));
  p = Fma(p, m, Set1(1.4249322787e-1f));
  p = Fma(p, m, Set1(-1.6668057665e-1f));
  p = Fma(p, m, Set1(2.0000714765e-1f));
  p = Fma(p, m, Set1(-2.4999993993e-1f));
  p = Fma(p, m, Set1(3.3333331174e-1f));
  Vf y = (p * m) * z;
  y = Fma(e, Set1(-2.12194440e-4f), y);
  y = Fma(z, Set1(-0.5f), y);
  Vf r = m + y;
  r = Fma(e, Set1(0.693359375f), r);
  r = Select(zero, Zero() - Inf(), r);
  r = Select(inf, Inf(), r);
  return Select(nan, QuietNan(), r);
}

// tanh: odd polynomial for |x| < 0.625, else 1 - 2/(e^{2|x|} + 1); sign copied from x.
inline Vf TanhV(Vf x) {
  const Vf a = Abs(x);
  const Mask small = Lt(a, Set1(0.625f));
  const Vf z = x * x;
  Vf p = Set1(-5.70498872745e-3f);
  p = Fma(p, z, Set1(2.06390887954e-2f));
  p = Fma(p, z, Set1(-5.37397155531e-2f));
  p = Fma(p, z, Set1(1.33314422036e-1f));
  p = Fma(p, z, Set1(-3.33332819422e-1f));
  const Vf ys = Fma(p * z, a, a);
  const Vf e = ExpV(a + a);
  const Vf yl = Set1(1.0f) - Set1(2.0f) / (e + Set1(1.0f));
  return CopySign(Select(small, ys, yl), x);
}

// erf: x * P(x^2) for |x| < 1; else 1 - e^{-x^2} Q(1/|x|) / |x| (|x| clamped to 4, where erf
// rounds to 1). Coefficients fitted by tools/ (least squares, relative error) in double.
inline Vf ErfV(Vf x) {
  const Vf a = Abs(x);
  const Mask small = Lt(a, Set1(1.0f));
  const Vf z = a * a;
  Vf p = Set1(-5.625396152e-04f);
  p = Fma(p, z, Set1(4.916023463e-03f));
  p = Fma(p, z, Set1(-2.670994960e-02f));
  p = Fma(p, z, Set1(1.128013059e-01f));
  p = Fma(p, z, Set1(-3.761231899e-01f));
  p = Fma(p, z, Set1(1.128379107e+00f));
  const Vf ys = p * a;
  Vf ac = Select(small, Set1(1.0f), a);
  ac = Select(Gt(ac, Set1(4.0f)), Set1(4.0f), ac);
  const Vf t = Set1(1.0f) / ac;
  Vf q = Set1(-4.684532434e-02f);
  q = Fma(q, t, Set1(3.183683455e-01f));
  q = Fma(q, t, Set1(-9.579898119e-01f));
  q = Fma(q, t, Set1(1.658530354e+00f));
  q = Fma(q, t, Set1(-1.763374925e+00f));
  q = Fma(q, t, Set1(1.062925220e+00f));
  q = Fma(q, t, Set1(-1.448299587e-01f));
  q = Fma(q, t, Set1(-2.618589103e-01f));
  q = Fma(q, t, Set1(-1.583039411e-03f));
  q = Fma(q, t, Set1(5.642415881e-01f));
  const Vf erfc = (ExpV(Zero() - ac * ac) * q) * t;
  const Vf yl = Set1(1.0f) - erfc;
  return CopySign(Select(small, ys, yl), x);
}

}  // namespace meshlearn::engine::MESHLEARN_SIMD_NS
