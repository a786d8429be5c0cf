// y = x W^T + b with a GGUF's Q6_K weights as they are stored and per-row int8 activations, row-invariant, any x86.
//
// Weights: each group of 16 inputs of one output column is  d * sc * (q - 32),  q in 0..63, sc an int8 per group,
// d a float32 (the file's fp16) per super-block of 16 groups (256 inputs): Q6_K's own form, kept exactly.
// Activations: each row is quantized inside the op with its own max-abs scale to codes a = nearest(x * 127 / max)
// in -127..127 (ties to even), exactly as the int4 op does.
// Per (row, column, super-block) one exact int32 sum, then one float step per super-block in K order:
//   isum = sum_g sc_g * (sum_t q a - 32 sum_t a)        |isum| <= 16 * 128 * 16 * 32 * 127 < 2^31
//   acc = fma(d, float(isum), acc)                       y = fma(acc, row scale, bias)  (or acc * row scale)
// Every output lane runs that sequence whatever the number of rows, the row tile, the column tile or the thread
// split (by output columns): a row's result cannot depend on anything else in the call.
//
// Three paths, chosen per call as for the int4 op ("amx" runs "vnni" here): "vnni" (vpdpbusd), "avx2" (vpmaddubsw:
// two pairs of products summed in int16 stay within 4 * 63 * 127 < 2^15, then vpmaddwd) and "portable" (plain C++).
// The int32 sums are exact on every path and the float steps the same IEEE operations in the same order: bitwise the
// same y. (The AVX2 path's many-row tiles multiply by the scales with vpmaddwd, the pair sums against each lane's sc
// twice, and take the -32 sum_t a terms two groups at a time from the row's group sums: the same exact integers.)
//
// Packed layout (structspec_ops/q6k.py `pack`): column blocks of 16 lanes, each one stream of super-blocks:
//   [d: 16 f32][sc: 16 groups x 16 lanes i8][codes: 16 groups x 192 bytes]
// A group's codes are 4 vectors of 64 (byte 4 * lane + b of vector i: input 4 i + b of the group, lane's column),
// stored as [low nibbles of vectors 0 and 1 (0 low, 1 high)][the same of 2 and 3][top 2 bits of 0, 1, 2, 3 at bits
// 0, 2, 4, 6]: 6.625 bits a weight with the scales, against the file's 6.5625.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "cpu_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;                           // output columns per block
constexpr int64_t kGroup = 16;                           // inputs per group
constexpr int64_t kGroups = 16;                          // groups per super-block
constexpr int64_t kSuper = kGroup * kGroups;             // inputs per super-block
constexpr int64_t kCodeBytes = 192;                      // code bytes per (block, group)
constexpr int64_t kScaleAt = 64;                         // byte offset of sc in a super-block
constexpr int64_t kCodesAt = kScaleAt + kGroups * kLanes;  // byte offset of the codes
constexpr int64_t kSuperBytes = kCodesAt + kGroups * kCodeBytes;
constexpr int kMaxRows = 4;    // rows per register tile
constexpr int kMaxBlocks = 2;  // column blocks per tile

struct Activations {
  const int8_t* codes;    // (n, K)
  const int32_t* minus;   // (n, K / 16): -32 times each group's sum of codes
  const int32_t* sum_pairs;  // (n, K / 32): the sums of codes of groups 2 j (low int16) and 2 j + 1 (high)
  const float* scales;    // (n,): max-abs / 127
  int64_t k;
};

struct Tile {
  const Activations* a;
  int64_t n, supers;
  const uint8_t* w[kMaxBlocks];
  int width;
  float* y;  // (n, ldy)
  int64_t ldy;
  const float* bias[kMaxBlocks];
  int64_t column[kMaxBlocks];
  int lanes[kMaxBlocks];
};

template <typename Run>
void for_row_tiles(int64_t n, Run run) {
  int64_t r0 = 0;
  for (; r0 + kMaxRows <= n; r0 += kMaxRows) run(r0, kMaxRows);
  if (n > r0) run(r0, static_cast<int>(n - r0));
}

// One row's codes, the int4 op's rounding (plain IEEE steps, the same on every path), and its group sums. Nearest,
// ties to even, as (v + 1.5 * 2^23) - 1.5 * 2^23 rounds any |v| < 2^22 (here |v| <= 127): vectorisable, no libm.
void quantize_row(const float* x, int64_t k, int8_t* codes, int32_t* minus, int32_t* sum_pairs, float* scale) {
  constexpr float kRound = 12582912.f;
  float maxabs = 0.f;
  for (int64_t i = 0; i < k; ++i) maxabs = std::max(maxabs, std::fabs(x[i]));
  const float inv = maxabs > 0.f ? 127.f / maxabs : 0.f;
  *scale = maxabs / 127.f;
  int32_t even = 0;  // the sum of the last even group's codes
  for (int64_t g = 0; g < k; g += kGroup) {
    int32_t sum = 0;
    for (int64_t t = 0; t < kGroup; ++t) {
      const float nearest = (x[g + t] * inv + kRound) - kRound;
      const int32_t a = std::clamp<int32_t>(static_cast<int32_t>(nearest), -128, 127);
      codes[g + t] = static_cast<int8_t>(a);
      sum += a;
    }
    minus[g / kGroup] = -32 * sum;
    if ((g / kGroup) % 2 == 0) {
      even = sum;
    } else {  // |sum| <= 16 * 128: an int16 each
      const uint32_t low = static_cast<uint16_t>(even), high = static_cast<uint16_t>(sum);
      sum_pairs[g / (2 * kGroup)] = static_cast<int32_t>(low | high << 16);
    }
  }
}

// The code of input 4 i + b of lane `lane` in a group's 192 bytes.
inline int32_t code_at(const uint8_t* group, int i, int lane, int b) {
  const int64_t j = 4 * lane + b;
  const uint8_t low = group[64 * (i / 2) + j], top = group[128 + j];
  return ((i % 2 ? low >> 4 : low) & 15) | (((top >> (2 * i)) & 3) << 4);
}

void store(const Tile& job, int c, int64_t row, const float* acc, float row_scale) {
  const float* bias = job.bias[c];
  float* y = job.y + row * job.ldy + job.column[c];
  for (int lane = 0; lane < job.lanes[c]; ++lane)
    y[lane] = bias == nullptr ? acc[lane] * row_scale : std::fma(acc[lane], row_scale, bias[lane]);
}

// ------------------------------------------------------------------------------------------------ portable

namespace portable {

void tile(const Tile& job, int64_t r0, int rows, int c) {
  const Activations& a = *job.a;
  float acc[kMaxRows][kLanes] = {};
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base = job.w[c] + s * kSuperBytes;
    float d[kLanes];
    std::memcpy(d, base, sizeof d);
    int32_t isum[kMaxRows][kLanes] = {};
    for (int64_t g = 0; g < kGroups; ++g) {
      const uint8_t* group = base + kCodesAt + g * kCodeBytes;
      const int8_t* sc = reinterpret_cast<const int8_t*>(base + kScaleAt + g * kLanes);
      int32_t q[kGroup][kLanes];
      for (int i = 0; i < 4; ++i)
        for (int lane = 0; lane < kLanes; ++lane)
          for (int b = 0; b < 4; ++b) q[4 * i + b][lane] = code_at(group, i, lane, b);
      for (int r = 0; r < rows; ++r) {
        const int64_t at = (s * kGroups + g);
        const int8_t* act = a.codes + (r0 + r) * a.k + at * kGroup;
        int32_t dot[kLanes];
        for (int lane = 0; lane < kLanes; ++lane) dot[lane] = a.minus[(r0 + r) * (a.k / kGroup) + at];
        for (int t = 0; t < kGroup; ++t)
          for (int lane = 0; lane < kLanes; ++lane) dot[lane] += q[t][lane] * act[t];
        for (int lane = 0; lane < kLanes; ++lane) isum[r][lane] += sc[lane] * dot[lane];
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int lane = 0; lane < kLanes; ++lane) acc[r][lane] = std::fma(d[lane], static_cast<float>(isum[r][lane]),
                                                                        acc[r][lane]);
  }
  for (int r = 0; r < rows; ++r) store(job, c, r0 + r, acc[r], a.scales[r0 + r]);
}

void run(const Tile& job) {
  for (int c = 0; c < job.width; ++c) for_row_tiles(job.n, [&](int64_t r0, int rows) { tile(job, r0, rows, c); });
}

}  // namespace portable

// ------------------------------------------------------------------------------------------------ AVX2 + FMA

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

inline __m256i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm256_set1_epi32(word);
}

// The 4 code vectors (8 lanes `half`) of a group.
inline void unpack(const uint8_t* group, int half, __m256i v[4]) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
  const __m256i l01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * half));
  const __m256i l23 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 64 + 32 * half));
  const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 128 + 32 * half));
  v[0] = _mm256_or_si256(_mm256_and_si256(l01, low), _mm256_and_si256(_mm256_slli_epi16(top, 4), two));
  v[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l01, 4), low),
                         _mm256_and_si256(_mm256_slli_epi16(top, 2), two));
  v[2] = _mm256_or_si256(_mm256_and_si256(l23, low), _mm256_and_si256(top, two));
  v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l23, 4), low),
                         _mm256_and_si256(_mm256_srli_epi16(top, 2), two));
}

inline __m256i in_register(__m256i v) {  // GCC would otherwise reassociate the sums into a tree of spilled terms
  asm("" : "+x"(v));
  return v;
}

// 8 lanes' scales of a group, each in both int16 halves of its lane's int32: vpmaddwd by it multiplies a lane's pair
// sums by its scale and adds them.
inline __m256i scale_pairs(const uint8_t* sc) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(raw, raw));
}

// 8 lanes' scales of groups 2 j and 2 j + 1 as int16 pairs (the first in the low half).
inline __m256i scales_of_two_groups(const uint8_t* sc_even) {
  const __m128i even = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc_even));
  const __m128i odd = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc_even + kLanes));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(even, odd));
}

// Where a tile's code vectors come from: unpacked from the stream at each use (few rows), or from `Unpacked`, the
// tile's blocks unpacked once per call (many rows: the unpacking is a third of a group's vector operations).
struct FromStream {
  const uint8_t* const* w;  // (C,) the blocks' streams
  void operator()(int c, int64_t at, int half, __m256i v[4]) const {
    unpack(w[c] + (at / kGroups) * kSuperBytes + kCodesAt + (at % kGroups) * kCodeBytes, half, v);
  }
};

struct Unpacked {
  const __m256i* codes;  // (C, groups, 2, 4): block c's group `at`, half h, vector i at (c groups + at) 8 + 4 h + i
  int64_t groups;
  void operator()(int c, int64_t at, int half, __m256i v[4]) const {
    const __m256i* from = codes + (c * groups + at) * 8 + 4 * half;
    for (int i = 0; i < 4; ++i) v[i] = _mm256_load_si256(from + i);
  }
};

// The integer pass of group `at` (in K order): dots[q][r], slice q's (block q / 2, lanes 8 (q % 2)..) sums of products
// with row r's codes times the group's scale, int32, exact: two pairs of products summed in int16 stay within
// 4 * 63 * 128 < 2^15, times |sc| <= 128.
template <int R, int C, typename Codes>
void group_dots(const Codes& codes, const uint8_t* const (&base)[C], int64_t at, const int8_t* const (&rows)[R],
                __m256i (&dots)[2 * C][R]) {
  for (int q = 0; q < 2 * C; ++q) {
    __m256i v[4];
    codes(q / 2, at, q % 2, v);
    const __m256i sc = scale_pairs(base[q / 2] + kScaleAt + (at % kGroups) * kLanes + 8 * (q % 2));
    for (int r = 0; r < R; ++r) {
      const int8_t* a = rows[r] + at * kGroup;
      const __m256i p01 = in_register(_mm256_add_epi16(_mm256_maddubs_epi16(v[0], broadcast4(a)),
                                                       _mm256_maddubs_epi16(v[1], broadcast4(a + 4))));
      const __m256i p23 = in_register(_mm256_add_epi16(_mm256_maddubs_epi16(v[2], broadcast4(a + 8)),
                                                       _mm256_maddubs_epi16(v[3], broadcast4(a + 12))));
      _mm256_store_si256(&dots[q][r], _mm256_add_epi32(_mm256_madd_epi16(p01, sc), _mm256_madd_epi16(p23, sc)));
    }
  }
}

// R rows (from r0) times the 16 lanes of the tile's C column blocks, a super-block at a time in two passes:
// `group_dots` for each group, then per slice and row the exact int32 sum over the groups, less 32 times the groups'
// scales times the row's group sums (vpmaddwd over pairs of groups), and the float step: the portable path's integers
// and float steps, so its bits. Against one pass (vpmulld by the scale each group, half a block at a time for 3-4
// rows) and each tile unpacking its own codes, on a Zen 3: 59 -> 72 G multiply-adds a second at 64-128 rows.
template <int R, int C, typename Codes>
void tile(const Tile& job, int64_t r0, const Codes& codes) {
  constexpr int S = 2 * C;
  const Activations& a = *job.a;
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = a.codes + (r0 + r) * a.k;
  alignas(32) __m256i dots[kGroups][S][R];
  __m256 acc[S][R];
  for (int q = 0; q < S; ++q)
    for (int r = 0; r < R; ++r) acc[q][r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base[C];
    for (int c = 0; c < C; ++c) base[c] = job.w[c] + s * kSuperBytes;
    for (int64_t g = 0; g < kGroups; ++g) group_dots<R, C>(codes, base, s * kGroups + g, rows, dots[g]);
    for (int q = 0; q < S; ++q) {
      const uint8_t* block = base[q / 2];
      __m256i sc2[kGroups / 2];
      for (int j = 0; j < kGroups / 2; ++j)
        sc2[j] = scales_of_two_groups(block + kScaleAt + 2 * j * kLanes + 8 * (q % 2));
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(block) + 8 * (q % 2));
      for (int r = 0; r < R; ++r) {
        const int32_t* sums = a.sum_pairs + (r0 + r) * (a.k / (2 * kGroup)) + s * (kGroups / 2);
        __m256i isum = _mm256_setzero_si256(), msum = _mm256_setzero_si256();
        for (int64_t g = 0; g < kGroups; ++g) isum = _mm256_add_epi32(isum, _mm256_load_si256(&dots[g][q][r]));
        for (int j = 0; j < kGroups / 2; ++j)
          msum = _mm256_add_epi32(msum, _mm256_madd_epi16(sc2[j], _mm256_set1_epi32(sums[j])));
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(msum, 5));  // the -32 sum_t a of each group
        acc[q][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[q][r]);
      }
    }
  }
  for (int q = 0; q < S; ++q) {
    const int c = q / 2, h = q % 2, lanes = std::min(8, job.lanes[c] - 8 * h);
    if (lanes <= 0) continue;  // a block of 8 lanes or fewer: its second half holds padding only
    for (int r = 0; r < R; ++r) {
      alignas(32) float values[8];
      _mm256_store_ps(values, acc[q][r]);
      Tile part = job;  // store lanes 8 h .. of block c only
      part.column[c] = job.column[c] + 8 * h;
      part.lanes[c] = lanes;
      part.bias[c] = job.bias[c] == nullptr ? nullptr : job.bias[c] + 8 * h;
      store(part, c, r0 + r, values, a.scales[r0 + r]);
    }
  }
}

// One row times the tile's two blocks, the blocks' streams interleaved group by group (two streams in flight: a cold
// one-row call of 1536 x 8960 took 0.65-0.79 ms on a Zen 3 against 0.90-1.14 ms one block after the other).
// Slice q: block q / 2, lanes 8 (q % 2)..; each lane's operations are those of `tile`.
void one_row_two_blocks(const Tile& job) {
  const Activations& a = *job.a;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4];
  for (int q = 0; q < 4; ++q) acc[q] = _mm256_setzero_ps();
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base[2] = {job.w[0] + s * kSuperBytes, job.w[1] + s * kSuperBytes};
    __m256i isum[4];
    for (int q = 0; q < 4; ++q) isum[q] = _mm256_setzero_si256();
    for (int64_t g = 0; g < kGroups; ++g) {
      const int64_t at = s * kGroups + g;
      const int8_t* row = a.codes + at * kGroup;
      const __m256i a0 = broadcast4(row), a1 = broadcast4(row + 4), a2 = broadcast4(row + 8),
                    a3 = broadcast4(row + 12), minus = _mm256_set1_epi32(a.minus[at]);
      for (int q = 0; q < 4; ++q) {
        const uint8_t* block = base[q / 2];
        __m256i v[4];
        unpack(block + kCodesAt + g * kCodeBytes, q % 2, v);
        const __m256i sc = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kScaleAt + g * kLanes + 8 * (q % 2))));
        const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(v[0], a0), _mm256_maddubs_epi16(v[1], a1));
        const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(v[2], a2), _mm256_maddubs_epi16(v[3], a3));
        const __m256i dot =
            _mm256_add_epi32(minus, _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)));
        isum[q] = in_register(_mm256_add_epi32(isum[q], _mm256_mullo_epi32(sc, dot)));
      }
    }
    for (int q = 0; q < 4; ++q) {
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(base[q / 2]) + 8 * (q % 2));
      acc[q] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[q]), acc[q]);
    }
  }
  for (int q = 0; q < 4; ++q) {
    const int c = q / 2, h = q % 2, lanes = std::min(8, job.lanes[c] - 8 * h);
    if (lanes <= 0) continue;  // a block of 8 lanes or fewer: its second half holds padding only
    alignas(32) float values[8];
    _mm256_store_ps(values, acc[q]);
    Tile part = job;  // store lanes 8 h .. of block c only
    part.column[c] = job.column[c] + 8 * h;
    part.lanes[c] = lanes;
    part.bias[c] = job.bias[c] == nullptr ? nullptr : job.bias[c] + 8 * h;
    store(part, c, 0, values, a.scales[0]);
  }
}

template <int C, typename Codes>
void rows_of(const Tile& job, const Codes& codes) {
  for_row_tiles(job.n, [&](int64_t r0, int rows) {
    switch (rows) {
      case 4: tile<4, C>(job, r0, codes); break;
      case 3: tile<3, C>(job, r0, codes); break;
      case 2: tile<2, C>(job, r0, codes); break;
      default: tile<1, C>(job, r0, codes); break;
    }
  });
}

template <typename Codes>
void rows_of(const Tile& job, const Codes& codes) {
  if (job.width == 2) rows_of<2>(job, codes);
  else rows_of<1>(job, codes);
}

constexpr int64_t kUnpackOnceRows = 8;  // from this many rows a tile's blocks are unpacked once per call

void run(const Tile& job) {
  if (job.n == 1 && job.width == 2) return one_row_two_blocks(job);
  if (job.n < kUnpackOnceRows) return rows_of(job, FromStream{job.w});
  thread_local std::vector<uint8_t> scratch;  // (width, groups, 2, 4) vectors: 16 K bytes a block
  const int64_t groups = job.supers * kGroups;
  scratch.resize(job.width * groups * 8 * sizeof(__m256i) + 32);
  __m256i* codes = reinterpret_cast<__m256i*>((reinterpret_cast<uintptr_t>(scratch.data()) + 31) & ~uintptr_t{31});
  const FromStream stream{job.w};
  for (int c = 0; c < job.width; ++c)
    for (int64_t at = 0; at < groups; ++at)
      for (int h = 0; h < 2; ++h) stream(c, at, h, codes + (c * groups + at) * 8 + 4 * h);
  rows_of(job, Unpacked{codes, groups});
}

}  // namespace avx2
#pragma GCC pop_options

// ------------------------------------------------------------------------------------------------ AVX-512 VNNI

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
namespace vnni {

inline __m512i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

inline void unpack(const uint8_t* group, __m512i v[4]) {
  const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x30);
  const __m512i l01 = _mm512_loadu_si512(group), l23 = _mm512_loadu_si512(group + 64);
  const __m512i top = _mm512_loadu_si512(group + 128);
  v[0] = _mm512_or_si512(_mm512_and_si512(l01, low), _mm512_and_si512(_mm512_slli_epi16(top, 4), two));
  v[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l01, 4), low),
                         _mm512_and_si512(_mm512_slli_epi16(top, 2), two));
  v[2] = _mm512_or_si512(_mm512_and_si512(l23, low), _mm512_and_si512(top, two));
  v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l23, 4), low),
                         _mm512_and_si512(_mm512_srli_epi16(top, 2), two));
}

template <int R, int C>
void tile(const Tile& job, int64_t r0) {
  const Activations& a = *job.a;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base[C];
    for (int c = 0; c < C; ++c) base[c] = job.w[c] + s * kSuperBytes;
    __m512i isum[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) isum[r][c] = _mm512_setzero_si512();
    for (int64_t g = 0; g < kGroups; ++g) {
      const int64_t at = s * kGroups + g;
      __m512i v[C][4], sc[C];
      for (int c = 0; c < C; ++c) {
        unpack(base[c] + kCodesAt + g * kCodeBytes, v[c]);
        sc[c] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base[c] + kScaleAt + g * kLanes)));
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* row = a.codes + (r0 + r) * a.k + at * kGroup;
        const __m512i a0 = broadcast4(row), a1 = broadcast4(row + 4), a2 = broadcast4(row + 8),
                      a3 = broadcast4(row + 12), minus = _mm512_set1_epi32(a.minus[(r0 + r) * (a.k / kGroup) + at]);
        for (int c = 0; c < C; ++c) {
          __m512i dot = _mm512_dpbusd_epi32(minus, v[c][0], a0);
          dot = _mm512_dpbusd_epi32(dot, v[c][1], a1);
          dot = _mm512_dpbusd_epi32(dot, v[c][2], a2);
          dot = _mm512_dpbusd_epi32(dot, v[c][3], a3);
          isum[r][c] = _mm512_add_epi32(isum[r][c], _mm512_mullo_epi32(sc[c], dot));
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(base[c]));
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[r][c]), acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 row_scale = _mm512_set1_ps(a.scales[r0 + r]);
    for (int c = 0; c < C; ++c) {
      const __mmask16 lanes = static_cast<__mmask16>((1u << job.lanes[c]) - 1u);
      float* y = job.y + (r0 + r) * job.ldy + job.column[c];
      const __m512 v = job.bias[c] == nullptr
                           ? _mm512_mul_ps(acc[r][c], row_scale)
                           : _mm512_fmadd_ps(acc[r][c], row_scale, _mm512_maskz_loadu_ps(lanes, job.bias[c]));
      _mm512_mask_storeu_ps(y, lanes, v);
    }
  }
}

template <int C>
void rows_of(const Tile& job) {
  for_row_tiles(job.n, [&](int64_t r0, int rows) {
    switch (rows) {
      case 4: tile<4, C>(job, r0); break;
      case 3: tile<3, C>(job, r0); break;
      case 2: tile<2, C>(job, r0); break;
      default: tile<1, C>(job, r0); break;
    }
  });
}

void run(const Tile& job) {
  if (job.width == 2) rows_of<2>(job);
  else rows_of<1>(job);
}

}  // namespace vnni
#pragma GCC pop_options

// ------------------------------------------------------------------------------------------------ dispatch

struct Path {
  const char* name;
  bool (*supported)();
  void (*run)(const Tile&);
};

// "amx" runs the VNNI path: AMX tiles (tdpbsud a group of 16, the dots stored, then vpmulld by each lane's sc) measured
// 0.73-1.04x the VNNI path on a Xeon with AMX-INT8 (16-128 rows, Qwen2.5's down_proj and v_proj shapes): the exact
// per-group scale multiply, not the products, bounds this op.
const Path kPaths[] = {{"amx", structspec::has_amx, vnni::run},
                       {"vnni", structspec::has_vnni, vnni::run},
                       {"avx2", structspec::has_avx2, avx2::run},
                       {"portable", structspec::always, portable::run}};

const Path& choose(const std::string& name) { return structspec::choose_path(kPaths, name, "q6k_linear"); }

}  // namespace

std::vector<std::string> q6k_paths() { return structspec::supported_paths(kPaths); }

// x (n, in) float32, in % 256 == 0; packed uint8 (`pack`); bias (out,) float32 or None; blocks: int64 column blocks
// to compute (output (n, 16 * len(blocks)), block j at columns 16 j..), or None: all (output (n, out)); path: "auto"
// or a name.
at::Tensor q6k_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                      int64_t out_features, const c10::optional<at::Tensor>& blocks, c10::string_view path_name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "q6k_linear: x must be a contiguous (n, in) float32 CPU tensor");
  TORCH_CHECK(x.size(1) % kSuper == 0, "q6k_linear: in_features ", x.size(1), " is not a multiple of 256");
  const int64_t n = x.size(0), k = x.size(1), supers = k / kSuper;
  const int64_t all_blocks = (out_features + kLanes - 1) / kLanes;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == all_blocks * supers * kSuperBytes,
              "q6k_linear: packed weights of ", packed.numel(), " bytes, expected ", all_blocks * supers * kSuperBytes);
  const Path& path = choose(std::string(path_name));
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out_features,
                "q6k_linear: bias must be (out,) float32");
    bias_data = bias->data_ptr<float>();
  }
  const structspec::Blocks chosen(blocks, out_features, kLanes, "q6k_linear");
  const int64_t ldy = chosen.width(kLanes, out_features);
  at::Tensor y = chosen.subset ? at::zeros({n, ldy}, x.options()) : at::empty({n, ldy}, x.options());
  at::Tensor codes = at::empty({n, k}, x.options().dtype(at::kChar));
  at::Tensor minus = at::empty({n, k / kGroup}, x.options().dtype(at::kInt));
  at::Tensor sum_pairs = at::empty({n, k / (2 * kGroup)}, x.options().dtype(at::kInt));
  at::Tensor scales = at::empty({n}, x.options());
  const float* xs = x.data_ptr<float>();
  int8_t* code_data = codes.data_ptr<int8_t>();
  int32_t* minus_data = minus.data_ptr<int32_t>();
  int32_t* pair_data = sum_pairs.data_ptr<int32_t>();
  float* scale_data = scales.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)  // O(n K): a few microseconds a row beside the O(n K out) products
    quantize_row(xs + r * k, k, code_data + r * k, minus_data + r * (k / kGroup), pair_data + r * (k / (2 * kGroup)),
                 scale_data + r);
  const Activations a{code_data, minus_data, pair_data, scale_data, k};
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* y_data = y.data_ptr<float>();
  const int64_t block_bytes = supers * kSuperBytes;
  const structspec::TilePlan plan(chosen.count);
  at::parallel_for(0, plan.tiles(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Tile job{&a, n, supers, {nullptr, nullptr}, 0, y_data, ldy, {nullptr, nullptr}, {0, 0}, {0, 0}};
      job.width = plan.width(t);
      for (int c = 0; c < job.width; ++c) {
        const int64_t j = plan.block(t, c), block = chosen.data[j];
        job.w[c] = w + block * block_bytes;
        job.bias[c] = bias_data == nullptr ? nullptr : bias_data + block * kLanes;
        job.column[c] = chosen.column(j, kLanes);
        job.lanes[c] = static_cast<int>(std::min<int64_t>(kLanes, out_features - block * kLanes));
      }
      path.run(job);
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(structspec, m) {
  m.def("q6k_linear(Tensor x, Tensor packed, Tensor? bias, int out_features, Tensor? blocks=None, str path='auto') "
        "-> Tensor");
  m.def("q6k_paths() -> str[]", &q6k_paths);
}

TORCH_LIBRARY_IMPL(structspec, CPU, m) { m.impl("q6k_linear", &q6k_linear); }
