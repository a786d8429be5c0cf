// Element-wise float math on GCC / Clang vector types, compiled once per instruction set (target_clones) and the
// same bits on each: every step is one IEEE operation on each lane alone, and the libraries that include this are
// built with -ffp-contract=off (no fused multiply-add), so a value depends neither on its lane nor on the ISA.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define STRUCTSPEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef STRUCTSPEC_CLONES
#define STRUCTSPEC_CLONES
#endif
// Helpers are inlined into each clone, so that they are compiled for its ISA too.
#define INLINE inline __attribute__((always_inline))

namespace structspec {

typedef float F16 __attribute__((vector_size(64)));  // lowered to whatever registers the clone's ISA has
typedef int32_t I16 __attribute__((vector_size(64)));

INLINE F16 splat(float value) { return F16{} + value; }

// exp(x) lane by lane, within 2 ulps for x in [-87, 88] (clamped there: no infinities, no subnormals): x = n ln2 + r
// with n = floor(x log2(e) + 1/2) and r taken off in two parts (Cody and Waite), exp(r) by Cephes' degree-6
// polynomial, times 2^n built in the exponent bits.
INLINE F16 exp16(F16 x) {
  const F16 high = splat(88.f), low = splat(-87.f);
  x = x < high ? x : high;
  x = x > low ? x : low;
  const F16 scaled = x * splat(1.44269504088896341f) + splat(0.5f);
  I16 n = __builtin_convertvector(scaled, I16);                // toward zero ...
  n = n + (__builtin_convertvector(n, F16) > scaled);         // ... then down: floor (a true compare is -1)
  const F16 whole = __builtin_convertvector(n, F16);
  F16 r = x - whole * splat(0.693359375f);
  r = r - whole * splat(-2.12194440e-4f);
  F16 p = splat(1.9875691500e-4f) * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const F16 e = p * (r * r) + r + splat(1.f);
  const I16 bits = (n + 127) << 23;  // 2^n, n in [-126, 127]
  F16 two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof two_to_n);
  return e * two_to_n;
}

}  // namespace structspec
