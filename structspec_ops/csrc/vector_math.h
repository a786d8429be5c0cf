// Element-wise float math on GCC / Clang vector types, compiled once per instruction set and the same bits on each:
// every step is one IEEE operation on each lane alone, and the libraries that include this are built with
// -ffp-contract=off (no fused multiply-add), so a value depends neither on its lane nor on the ISA.
//
// Each ISA gets its own register width: a vector type wider than the ISA's registers is kept in memory by GCC (an
// AVX2 clone of 16-float code ran attention 3x slower than torch), so kernels are templates over the native vector
// `V` (F16, F8 or F4) and are instantiated per ISA by STRUCTSPEC_PER_ISA (GCC's function multi-versioning: one
// definition per ISA under one name, chosen at load time by the CPU).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define STRUCTSPEC_MULTIVERSION 1
#endif
// Helpers are inlined into each ISA's definition, so that they are compiled for its ISA too.
#define INLINE inline __attribute__((always_inline))

namespace structspec {

typedef float F16 __attribute__((vector_size(64)));  // AVX-512: one register
typedef float F8 __attribute__((vector_size(32)));   // AVX2
typedef float F4 __attribute__((vector_size(16)));   // baseline x86-64 (SSE2)

template <class V> constexpr int64_t kWidth = sizeof(V) / sizeof(float);

template <class V> struct IntLanes;  // the int32 vector with V's lanes
template <> struct IntLanes<F16> { typedef int32_t type __attribute__((vector_size(64))); };
template <> struct IntLanes<F8> { typedef int32_t type __attribute__((vector_size(32))); };
template <> struct IntLanes<F4> { typedef int32_t type __attribute__((vector_size(16))); };

template <class V> INLINE V splat(float value) { return V{} + value; }

template <class V> INLINE V load(const float* p) {
  V x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

template <class V> INLINE V load_tail(const float* p, int64_t count) {  // p[0 .. count), zeros after
  V x{};
  std::memcpy(&x, p, count * sizeof(float));
  return x;
}

template <class V> INLINE void store(float* p, V x) { std::memcpy(p, &x, sizeof x); }

// exp(x) lane by lane, within 2 ulps for x in [-87, 88] (clamped there: no infinities, no subnormals): x = n ln2 + r
// with n = floor(x log2(e) + 1/2) and r taken off in two parts (Cody and Waite), exp(r) by Cephes' degree-6
// polynomial, times 2^n built in the exponent bits.
template <class V> INLINE V exp_lanes(V x) {
  using I = typename IntLanes<V>::type;
  const V high = splat<V>(88.f), low = splat<V>(-87.f);
  x = x < high ? x : high;
  x = x > low ? x : low;
  const V scaled = x * splat<V>(1.44269504088896341f) + splat<V>(0.5f);
  I n = __builtin_convertvector(scaled, I);                // toward zero ...
  n = n + (__builtin_convertvector(n, V) > scaled);         // ... then down: floor (a true compare is -1)
  const V whole = __builtin_convertvector(n, V);
  V r = x - whole * splat<V>(0.693359375f);
  r = r - whole * splat<V>(-2.12194440e-4f);
  V p = splat<V>(1.9875691500e-4f) * r + splat<V>(1.3981999507e-3f);
  p = p * r + splat<V>(8.3334519073e-3f);
  p = p * r + splat<V>(4.1665795894e-2f);
  p = p * r + splat<V>(1.6666665459e-1f);
  p = p * r + splat<V>(5.0000001201e-1f);
  const V e = p * (r * r) + r + splat<V>(1.f);
  const I bits = (n + 127) << 23;  // 2^n, n in [-126, 127]
  V two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof two_to_n);
  return e * two_to_n;
}

}  // namespace structspec

// STRUCTSPEC_PER_ISA(ret, name, params, body...): defines `ret name params` once per ISA, where the body (statements)
// sees its native vector as the type `V`. Without multi-versioning, one definition with 8 lanes (the compiler's
// generic lowering keeps the same bits).
#ifdef STRUCTSPEC_MULTIVERSION
#define STRUCTSPEC_PER_ISA(ret, name, params, ...)                                          \
  __attribute__((target("avx512f"))) ret name params { using V = structspec::F16; __VA_ARGS__ } \
  __attribute__((target("avx2"))) ret name params { using V = structspec::F8; __VA_ARGS__ }     \
  __attribute__((target("default"))) ret name params { using V = structspec::F4; __VA_ARGS__ }
#else
#define STRUCTSPEC_PER_ISA(ret, name, params, ...) \
  ret name params { using V = structspec::F8; __VA_ARGS__ }
#endif
