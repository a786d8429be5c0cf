// y = x W^T + b with 4-bit weights in groups of 32 and per-row int8 activations, row-invariant, on any x86 CPU.
//
// Weights: each group of 32 inputs of one output column is  scale * q + offset,  q in 0..15, with
//   scale = d * sc   and   offset = (0 - dmin) * m
// where d, dmin are float32 per super-block of G groups (Q4_K: G = 8) and sc, m are bytes per group (Q4_K's 6-bit
// ones; Q4_0, Q4_1 and float scales: G = 1, sc = m = 1).
// Activations: each row is quantized inside the op with its own max-abs scale to codes a = nearest(x * 127 / max)
// in -127..127 (ties to even).
// Per (row, column, group): dot = sum q * a (int32, exact) and the row's int32 sum of its codes; the groups are added
// in float in K order:
//   acc = fma(scale, dot, acc); acc = fma(offset, sum, acc)      y = fma(acc, row scale, bias)  (or acc * row scale)
// Every output lane runs that sequence whatever the number of rows, the row tile, the column tile, the thread
// split (by output columns) or the columns asked for: a row's result cannot depend on anything else in the call.
//
// Four paths compute it, chosen per call (`path`): "amx" (AMX-INT8 tiles of 16 rows: tdpbsud; the rest as "vnni"),
// "vnni" (AVX-512 VNNI: vpdpbusd), "avx2" (AVX2 + FMA: vpmaddubsw, a group's 16 pair sums added in int16, then
// vpmaddwd; a group's sum of pairs is at most 16 * 15 * 128 < 2^15, so nothing saturates) and "portable" (plain C++,
// std::fma). The int32 sums are exact on every path and every float step is the same IEEE operation in the same
// order, so the four give bitwise the same y: the same model on every x86 CPU.
//
// Packed layout (structspec_ops/int4.py `pack`): column blocks of 16 lanes, each one stream of super-blocks:
//   [d: 16 f32][dmin: 16 f32][sc: G x 16 u8][m: G x 16 u8][codes: G x 256 u8]
// where a group's 256 code bytes are 4 vectors of 64; byte 4 * lane + b of vector i holds, in its low nibble, the
// code of input 4 i + b and, in its high nibble, that of input 16 + 4 i + b (of that lane's column).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "cpu_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;       // output columns per block
constexpr int64_t kGroup = 32;       // inputs per group
constexpr int64_t kCodeBytes = 256;  // code bytes per (block, group): 16 lanes x 32 inputs x 4 bits
constexpr int kMaxRows = 4;          // rows per register tile
constexpr int kMaxBlocks = 2;        // column blocks per tile
constexpr int kMaxGroups = 8;        // groups per super-block (Q4_K)

int64_t superblock_bytes(int64_t groups) { return 2 * 64 + groups * (2 * kLanes + kCodeBytes); }

// Per-row int8 activations and what each group needs of them.
struct Activations {
  const int8_t* codes;   // (n, K)
  const float* sums;     // (n, K / 32): the int32 sum of each group's codes, as float (exact)
  const float* scales;   // (n,): max-abs / 127
  int64_t k;
};

// Where a tile writes: per column block, its output column, bias and the number of lanes that exist.
struct Outputs {
  float* y;  // (n, ldy)
  int64_t ldy;
  const float* bias[kMaxBlocks];  // per block: `lanes` values, or nullptr
  int64_t column[kMaxBlocks];     // per block: its first column in y
  int lanes[kMaxBlocks];          // per block: 1..16
};

// One call's work for a column tile: `width` blocks whose streams start at `w`.
struct Tile {
  const Activations* a;
  int64_t n, supers, groups;
  const uint8_t* w[kMaxBlocks];
  int width;
  Outputs out;
};

// Rows from `first` in tiles of 4; 4 + 1 rows as one tile of 5 (a verify of 4 drafts has 5 rows) where the path has
// one; the last rows in a smaller tile. Which tile a row lands in never changes its lanes' sequence of operations.
template <typename Run>
void for_row_tiles(int64_t first, int64_t n, bool five, Run run) {
  const int64_t count = n - first;
  const int64_t fours = five && count % kMaxRows == 1 && count > kMaxRows ? n - kMaxRows - 1 : n;
  int64_t r0 = first;
  for (; r0 + kMaxRows <= fours; r0 += kMaxRows) run(r0, kMaxRows);
  if (n > r0) run(r0, static_cast<int>(n - r0));
}

// ------------------------------------------------------------------------------------------------ portable

namespace portable {

void quantize_row(const float* x, int64_t k, int8_t* codes, float* sums, float* scale) {
  float maxabs = 0.f;
  for (int64_t i = 0; i < k; ++i) maxabs = std::max(maxabs, std::fabs(x[i]));
  const float inv = maxabs > 0.f ? 127.f / maxabs : 0.f;
  *scale = maxabs / 127.f;
  for (int64_t g = 0; g < k; g += kGroup) {
    int32_t sum = 0;
    for (int64_t t = 0; t < kGroup; ++t) {
      const float v = x[g + t] * inv;
      const int32_t a = static_cast<int32_t>(std::nearbyint(v));  // nearest, ties to even
      sum += a;
      codes[g + t] = static_cast<int8_t>(std::clamp<int32_t>(a, -128, 127));
    }
    sums[g / kGroup] = static_cast<float>(sum);
  }
}

// Up to 4 rows (from r0) times the 16 lanes of column block c: a group's codes unpacked once for all rows, the int
// sums over lanes innermost (which the compiler vectorises), the float steps lane by lane with std::fma.
void tile(const Tile& job, int64_t r0, int rows, int c) {
  const Activations& a = *job.a;
  const int64_t groups = job.groups, stride = superblock_bytes(groups), sums_per_row = a.k / kGroup;
  float acc[kMaxRows][kLanes] = {};
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base = job.w[c] + s * stride;
    float d[kLanes], neg_dmin[kLanes];
    std::memcpy(d, base, sizeof d);
    std::memcpy(neg_dmin, base + 64, sizeof neg_dmin);
    for (int lane = 0; lane < kLanes; ++lane) neg_dmin[lane] = 0.f - neg_dmin[lane];
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t group = s * groups + g;
      const uint8_t* codes = base + 128 + 32 * groups + g * kCodeBytes;
      int32_t q[kGroup][kLanes];  // q[t][lane]: the code of input t of the group in lane's column
      for (int i = 0; i < 4; ++i)
        for (int lane = 0; lane < kLanes; ++lane)
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = codes[64 * i + 4 * lane + b];
            q[4 * i + b][lane] = byte & 15;
            q[16 + 4 * i + b][lane] = byte >> 4;
          }
      float scale[kLanes], offset[kLanes];
      for (int lane = 0; lane < kLanes; ++lane) {
        scale[lane] = d[lane] * static_cast<float>(base[128 + kLanes * g + lane]);
        offset[lane] = neg_dmin[lane] * static_cast<float>(base[128 + kLanes * (groups + g) + lane]);
      }
      for (int r = 0; r < rows; ++r) {
        const int8_t* act = a.codes + (r0 + r) * a.k + group * kGroup;
        int32_t dot[kLanes] = {};
        for (int t = 0; t < kGroup; ++t)
          for (int lane = 0; lane < kLanes; ++lane) dot[lane] += q[t][lane] * act[t];
        const float sum = a.sums[(r0 + r) * sums_per_row + group];
        for (int lane = 0; lane < kLanes; ++lane) {
          acc[r][lane] = std::fma(scale[lane], static_cast<float>(dot[lane]), acc[r][lane]);
          acc[r][lane] = std::fma(offset[lane], sum, acc[r][lane]);
        }
      }
    }
  }
  const float* bias = job.out.bias[c];
  for (int r = 0; r < rows; ++r) {
    const float row_scale = a.scales[r0 + r];
    float* y = job.out.y + (r0 + r) * job.out.ldy + job.out.column[c];
    for (int lane = 0; lane < job.out.lanes[c]; ++lane)
      y[lane] = bias == nullptr ? acc[r][lane] * row_scale : std::fma(acc[r][lane], row_scale, bias[lane]);
  }
}

void run(const Tile& job) {
  for (int c = 0; c < job.width; ++c)
    for_row_tiles(0, job.n, false, [&](int64_t r0, int rows) { tile(job, r0, rows, c); });
}

}  // namespace portable

// ------------------------------------------------------------------------------------------------ AVX2 + FMA

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

void quantize_row(const float* x, int64_t k, int8_t* codes, float* sums, float* scale) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 top = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float maxabs = 0.f;
  for (float v : lanes) maxabs = std::max(maxabs, v);  // exact, whatever the order
  const __m256 inv = _mm256_set1_ps(maxabs > 0.f ? 127.f / maxabs : 0.f);
  *scale = maxabs / 127.f;
  const __m256i lo = _mm256_set1_epi32(-128), hi = _mm256_set1_epi32(127);
  alignas(32) int32_t ints[kGroup];
  for (int64_t g = 0; g < k; g += kGroup) {
    __m256i sum = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + g + 8 * q), inv));  // nearest, even
      sum = _mm256_add_epi32(sum, a);
      _mm256_store_si256(reinterpret_cast<__m256i*>(ints + 8 * q), _mm256_min_epi32(_mm256_max_epi32(a, lo), hi));
    }
    for (int t = 0; t < kGroup; ++t) codes[g + t] = static_cast<int8_t>(ints[t]);
    alignas(32) int32_t parts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), sum);
    int32_t total = 0;
    for (int32_t p : parts) total += p;
    sums[g / kGroup] = static_cast<float>(total);
  }
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm256_set1_epi32(word);
}

// `v` as it is, in a register: GCC would otherwise reassociate a chain of integer adds into a tree of spilled terms.
inline __m256i in_register(__m256i v) {
  asm("" : "+x"(v));
  return v;
}

inline __m256 widen8(const uint8_t* p) {  // 8 bytes -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Whether the integer pass can hold every row's activations and all S slices' sums in the 16 registers (with one
// slice's codes and the nibble mask).
template <int R, int S>
constexpr bool kRowsHeld = R * S + 2 * R + 3 <= 16;

// The integer pass of group g of the super-block at `base` (one pointer a block): pairs[q][r], slice q's products
// with row r's activations (from rows[r] + k0) summed in pairs of lanes in int16 over the group (|sum| <= 8 * 2 * 15
// * 128 = 30720 < 2^15: exact), the blocks' streams read interleaved (two streams in flight).
template <int R, int C>
void group_pairs(const uint8_t* const (&base)[C], int64_t groups, int64_t g, const int8_t* const (&rows)[R],
                 int64_t k0, __m256i (&pairs)[2 * C][R]) {
  constexpr int S = 2 * C;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const auto codes = [&](int q, int i) {  // slice q's nibbles of inputs 4 i.. (low) and 16 + 4 i.. (high)
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        base[q / 2] + 128 + 32 * groups + g * kCodeBytes + 64 * i + 32 * (q % 2)));
  };
  const auto add = [](__m256i& sum, __m256i lo, __m256i hi, __m256i a_lo, __m256i a_hi) {
    sum = in_register(_mm256_add_epi16(sum, _mm256_maddubs_epi16(lo, a_lo)));  // |.| <= 3840 each
    sum = in_register(_mm256_add_epi16(sum, _mm256_maddubs_epi16(hi, a_hi)));
  };
  if constexpr (kRowsHeld<R, S>) {  // every slice at each 4-input step: the blocks' streams finely interleaved
    __m256i sum[S][R];
    for (int q = 0; q < S; ++q)
      for (int r = 0; r < R; ++r) sum[q][r] = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      __m256i a_lo[R], a_hi[R];
      for (int r = 0; r < R; ++r) {
        a_lo[r] = broadcast4(rows[r] + k0 + 4 * i);
        a_hi[r] = broadcast4(rows[r] + k0 + 16 + 4 * i);
      }
      for (int q = 0; q < S; ++q) {
        const __m256i raw = codes(q, i);
        const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        for (int r = 0; r < R; ++r) add(sum[q][r], lo, hi, a_lo[r], a_hi[r]);
      }
    }
    for (int q = 0; q < S; ++q)
      for (int r = 0; r < R; ++r) _mm256_store_si256(&pairs[q][r], sum[q][r]);
  } else {  // block by block, a group at a time: a block's two slices' codes held, row by row
    for (int c = 0; c < C; ++c) {
      __m256i sum[2][R];
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < R; ++r) sum[h][r] = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i raw = codes(2 * c + h, i);
          lo[h] = _mm256_and_si256(raw, low);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        }
        for (int r = 0; r < R; ++r) {
          const __m256i a_lo = broadcast4(rows[r] + k0 + 4 * i), a_hi = broadcast4(rows[r] + k0 + 16 + 4 * i);
          for (int h = 0; h < 2; ++h) add(sum[h][r], lo[h], hi[h], a_lo, a_hi);
        }
      }
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < R; ++r) _mm256_store_si256(&pairs[2 * c + h][r], sum[h][r]);
    }
  }
}

// The float pass of super-block s: each group's pair sums (`group_pairs`) widened by vpmaddwd (int32, exact) and
// added to acc[q][r] in K order (sums: row r's group sums at sums[r * sums_per_row + group]). A lane's sequence of
// operations is the same whatever Q, the number of slices whose accumulators run side by side: a tile of one or two
// rows has one or two chains of dependent FMAs a slice, so it runs all its slices together (measured on a Zen 3, cold
// calls of the Qwen2.5 1.5B's and 0.5B's shapes, alternating in one process: one row 1.05-1.12x faster, two rows
// 1.05-1.09x); a tile of more rows has chains enough and keeps Q = 1 (all slices together measured 0.94-0.96x there).
template <int R, int C>
void add_groups(const uint8_t* const (&base)[C], int64_t groups, int64_t s,
                const __m256i (&pairs)[kMaxGroups][2 * C][R], const float* sums, int64_t sums_per_row,
                __m256 (&acc)[2 * C][R]) {
  constexpr int S = 2 * C, Q = R <= 2 ? S : 1;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int q0 = 0; q0 < S; q0 += Q) {
    const uint8_t* block[Q];
    int lane0[Q];
    __m256 d[Q], neg_dmin[Q];
    for (int j = 0; j < Q; ++j) {
      block[j] = base[(q0 + j) / 2], lane0[j] = 8 * ((q0 + j) % 2);
      d[j] = _mm256_loadu_ps(reinterpret_cast<const float*>(block[j]) + lane0[j]);
      neg_dmin[j] = _mm256_sub_ps(_mm256_setzero_ps(),
                                  _mm256_loadu_ps(reinterpret_cast<const float*>(block[j] + 64) + lane0[j]));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t group = s * groups + g;
      __m256 scale[Q], offset[Q];
      for (int j = 0; j < Q; ++j) {
        scale[j] = _mm256_mul_ps(d[j], widen8(block[j] + 128 + kLanes * g + lane0[j]));
        offset[j] = _mm256_mul_ps(neg_dmin[j], widen8(block[j] + 128 + kLanes * (groups + g) + lane0[j]));
      }
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < Q; ++j) {
          __m256& sum = acc[q0 + j][r];
          const __m256i dot = _mm256_madd_epi16(_mm256_load_si256(&pairs[g][q0 + j][r]), ones);
          sum = _mm256_fmadd_ps(scale[j], _mm256_cvtepi32_ps(dot), sum);
          sum = _mm256_fmadd_ps(offset[j], _mm256_set1_ps(sums[r * sums_per_row + group]), sum);
        }
    }
  }
}

// R rows (from r0) times the 16 lanes of the tile's C column blocks, over the whole K: S = 2 C slices of 8 lanes (slice
// q: block q / 2, lanes 8 (q % 2)..), one super-block at a time in two passes that each fit the 16 registers:
// `group_pairs`, then the float pass (`add_groups`) that widens each group's sums by vpmaddwd (int32, exact) and adds
// the groups in K order. Measured on a Zen 3 against one pass (int32 sums a 4-input step, one block at a time, a half
// block at a time for 3-4 rows): a warm forward of 16 rows 1.25x faster; a cold call (8960 x 1536) 1.35x faster at one
// row (0.62 -> 0.46 ms), 1.25x at two, 1.17x at four.
template <int R, int C>
void tile(const Tile& job, int64_t r0) {
  constexpr int S = 2 * C;
  const Activations& a = *job.a;
  const int64_t groups = job.groups, stride = superblock_bytes(groups), sums_per_row = a.k / kGroup;
  const int8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = a.codes + (r0 + r) * a.k;
  alignas(32) __m256i pairs[kMaxGroups][S][R];
  __m256 acc[S][R];
  for (int q = 0; q < S; ++q)
    for (int r = 0; r < R; ++r) acc[q][r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base[C];
    for (int c = 0; c < C; ++c) base[c] = job.w[c] + s * stride;
    for (int64_t g = 0; g < groups; ++g)
      group_pairs<R, C>(base, groups, g, rows, (s * groups + g) * kGroup, pairs[g]);
    add_groups<R, C>(base, groups, s, pairs, a.sums + r0 * sums_per_row, sums_per_row, acc);
  }
  for (int q = 0; q < S; ++q) {
    const int c = q / 2, h = q % 2, lanes = std::min(8, job.out.lanes[c] - 8 * h);
    if (lanes <= 0) continue;  // a block of 8 lanes or fewer: its second half holds padding only
    const float* bias = job.out.bias[c];
    for (int r = 0; r < R; ++r) {
      alignas(32) float values[8];
      alignas(32) float biases[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      const __m256 row_scale = _mm256_set1_ps(a.scales[r0 + r]);
      if (bias != nullptr) std::memcpy(biases, bias + 8 * h, sizeof(float) * lanes);
      const __m256 v = bias == nullptr ? _mm256_mul_ps(acc[q][r], row_scale)
                                       : _mm256_fmadd_ps(acc[q][r], row_scale, _mm256_load_ps(biases));
      _mm256_store_ps(values, v);
      std::memcpy(job.out.y + (r0 + r) * job.out.ldy + job.out.column[c] + 8 * h, values, sizeof(float) * lanes);
    }
  }
}

template <int C>
void rows_of(const Tile& job) {
  for_row_tiles(0, job.n, false, [&](int64_t r0, int rows) {
    switch (rows) {
      case 4: tile<4, C>(job, r0); break;
      case 3: tile<3, C>(job, r0); break;
      case 2: tile<2, C>(job, r0); break;
      default: tile<1, C>(job, r0); break;
    }
  });
}

// A tile's two blocks are read together, their streams interleaved: two streams in flight.
void run(const Tile& job) {
  if (job.width == 2) rows_of<2>(job);
  else rows_of<1>(job);
}

}  // namespace avx2
#pragma GCC pop_options

// ------------------------------------------------------------------------------------------------ AVX-512 VNNI

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
namespace vnni {

void quantize_row(const float* x, int64_t k, int8_t* codes, float* sums, float* scale) {
  __m512 top = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += kLanes) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  const float maxabs = _mm512_reduce_max_ps(top);  // exact, whatever the order
  const __m512 inv = _mm512_set1_ps(maxabs > 0.f ? 127.f / maxabs : 0.f);
  *scale = maxabs / 127.f;
  for (int64_t g = 0; g < k; g += kGroup) {
    const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + g), inv));  // nearest, ties to even
    const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + g + kLanes), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + g), _mm512_cvtsepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + g + kLanes), _mm512_cvtsepi32_epi8(b));
    sums[g / kGroup] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(a, b)));
  }
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

inline __m512 widen(const uint8_t* p) {  // 16 bytes -> 16 floats
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// y[row, block c's lanes] = sum * row scale (+ bias): the last float step of every lane.
inline void write(const Tile& job, int64_t row, int c, __m512 sum) {
  const __m512 row_scale = _mm512_set1_ps(job.a->scales[row]);
  const __mmask16 lanes = static_cast<__mmask16>((1u << job.out.lanes[c]) - 1u);
  const __m512 v = job.out.bias[c] == nullptr
                       ? _mm512_mul_ps(sum, row_scale)
                       : _mm512_fmadd_ps(sum, row_scale, _mm512_maskz_loadu_ps(lanes, job.out.bias[c]));
  _mm512_mask_storeu_ps(job.out.y + row * job.out.ldy + job.out.column[c], lanes, v);
}

// Two int32 chains a lane (the low and the high nibbles' products) keep 8 products in flight for a small tile; a
// tile whose three accumulators a lane (float, two chains) and unpacked weights would not fit the 32 registers keeps
// one chain, which saves the spills and the sum (int32: exact in any order). A 5-row verify tile: 1.04-1.06x faster.
template <int R, int C>
constexpr bool kTwoChains = 3 * R * C + 2 * C + 2 <= 32;

// R rows (from r0) times C column blocks, over the whole K.
template <int R, int C>
void tile(const Tile& job, int64_t r0) {
  const Activations& a = *job.a;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t groups = job.groups, stride = superblock_bytes(groups), sums_per_row = a.k / kGroup;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < job.supers; ++s) {
    const uint8_t* base[C];
    __m512 d[C], neg_dmin[C];
    for (int c = 0; c < C; ++c) {
      base[c] = job.w[c] + s * stride;
      d[c] = _mm512_loadu_ps(reinterpret_cast<const float*>(base[c]));
      neg_dmin[c] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(reinterpret_cast<const float*>(base[c] + 64)));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t group = s * groups + g, k0 = group * kGroup;  // in K order
      __m512i dot[R][C], dot_hi[R][C];  // dot_hi: the high nibbles' chain where kTwoChains
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dot[r][c] = dot_hi[r][c] = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) {
        __m512i lo[C], hi[C];
        for (int c = 0; c < C; ++c) {
          const __m512i raw = _mm512_loadu_si512(base[c] + 128 + 32 * groups + g * kCodeBytes + 64 * i);
          lo[c] = _mm512_and_si512(raw, low);
          hi[c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        }
        for (int r = 0; r < R; ++r) {
          const int8_t* row = a.codes + (r0 + r) * a.k + k0 + 4 * i;
          const __m512i a_lo = broadcast4(row), a_hi = broadcast4(row + 16);
          for (int c = 0; c < C; ++c) {
            dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], lo[c], a_lo);
            if constexpr (kTwoChains<R, C>) dot_hi[r][c] = _mm512_dpbusd_epi32(dot_hi[r][c], hi[c], a_hi);
            else dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], hi[c], a_hi);
          }
        }
      }
      __m512 scale[C], offset[C];
      for (int c = 0; c < C; ++c) {
        scale[c] = _mm512_mul_ps(d[c], widen(base[c] + 128 + kLanes * g));  // d * sc
        offset[c] = _mm512_mul_ps(neg_dmin[c], widen(base[c] + 128 + kLanes * (groups + g)));  // -dmin * m
      }
      for (int r = 0; r < R; ++r) {
        const __m512 sum = _mm512_set1_ps(a.sums[(r0 + r) * sums_per_row + group]);
        for (int c = 0; c < C; ++c) {
          const __m512i sum_qa = kTwoChains<R, C> ? _mm512_add_epi32(dot[r][c], dot_hi[r][c]) : dot[r][c];  // exact
          acc[r][c] = _mm512_fmadd_ps(scale[c], _mm512_cvtepi32_ps(sum_qa), acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(offset[c], sum, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) write(job, r0 + r, c, acc[r][c]);
}

template <int C>
void rows_of(const Tile& job, int64_t first) {
  for_row_tiles(first, job.n, true, [&](int64_t r0, int rows) {
    switch (rows) {
      case 5: tile<kMaxRows + 1, C>(job, r0); break;
      case 4: tile<4, C>(job, r0); break;
      case 3: tile<3, C>(job, r0); break;
      case 2: tile<2, C>(job, r0); break;
      default: tile<1, C>(job, r0); break;
    }
  });
}

// Rows from `first` (the AMX path's rows past its last full tile).
void run(const Tile& job, int64_t first = 0) {
  if (job.width == 2) rows_of<2>(job, first);
  else rows_of<1>(job, first);
}

}  // namespace vnni
#pragma GCC pop_options

// ------------------------------------------------------------------------------------------------ AMX

// Rows in tiles of 16 on the AMX-INT8 tile unit, the rows past the last full tile on the VNNI path. Per group the
// tile unit yields every (row, lane)'s exact int32 dot at once (tdpbsud: signed codes times unsigned nibbles, 16 rows
// x 16 lanes x 32 inputs an instruction), and the float pass adds it as the VNNI path does: the same y, bit for bit.
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,fma")
namespace amx {

constexpr int kRows = 16;  // rows per tile

// Tile registers: 0 and 1 (5 and 6) the dots of blocks 0 and 1 of an even (odd) group (16 rows x 16 lanes, int32); 2
// (7) the rows' codes of that group (16 rows x 32 bytes); 3 and 4 the blocks' codes of a group, 4 inputs of a lane a
// row (8 x 64 bytes: row j holds inputs 4 j..4 j + 3 of lane l at bytes 4 l..).
struct alignas(64) Config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void configure() {
  Config config{};
  config.palette = 1;
  for (int t : {0, 1, 5, 6}) config.rows[t] = kRows, config.colsb[t] = 4 * kLanes;
  for (int t : {2, 7}) config.rows[t] = kRows, config.colsb[t] = kGroup;
  for (int t : {3, 4}) config.rows[t] = kGroup / 4, config.colsb[t] = 4 * kLanes;
  _tile_loadconfig(&config);
}

// A group's 256 code bytes (vector i: low nibbles inputs 4 i.., high nibbles 16 + 4 i..) as the tile unit reads them.
inline void unpack(const uint8_t* codes, uint8_t (&out)[8][64]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < 4; ++i) {
    const __m512i raw = _mm512_loadu_si512(codes + 64 * i);
    _mm512_store_si512(out[i], _mm512_and_si512(raw, low));
    _mm512_store_si512(out[4 + i], _mm512_and_si512(_mm512_srli_epi16(raw, 4), low));
  }
}

// The first `rows` rows (a multiple of 16) times the job's C blocks. Super-blocks outermost, so a group's codes are
// unpacked once for every row tile; acc (rows, C, 16 lanes) carries each lane's float sum across super-blocks.
template <int C>
void tiles(const Tile& job, int64_t rows, float* acc) {
  const Activations& a = *job.a;
  const int64_t groups = job.groups, stride = superblock_bytes(groups), sums_per_row = a.k / kGroup;
  alignas(64) uint8_t codes[kMaxGroups][C][8][64];
  alignas(64) int32_t dots[kMaxGroups][C][kRows][kLanes];
  __m512 scale[kMaxGroups][C], offset[kMaxGroups][C];
  for (int64_t s = 0; s < job.supers; ++s) {
    for (int c = 0; c < C; ++c) {
      const uint8_t* base = job.w[c] + s * stride;
      const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(base));
      const __m512 neg_dmin =
          _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(reinterpret_cast<const float*>(base + 64)));
      for (int64_t g = 0; g < groups; ++g) {
        unpack(base + 128 + 32 * groups + g * kCodeBytes, codes[g][c]);
        scale[g][c] = _mm512_mul_ps(d, vnni::widen(base + 128 + kLanes * g));  // d * sc
        offset[g][c] = _mm512_mul_ps(neg_dmin, vnni::widen(base + 128 + kLanes * (groups + g)));  // -dmin * m
      }
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      // Even groups in tiles 2 -> 0, 1 and odd ones in 7 -> 5, 6, each group's dots stored after the next group's
      // products are issued, so the tile unit never waits for a store (the intrinsics take tile numbers as literals).
#define STRUCTSPEC_GROUP_DOTS(A, C0, C1, g)                                     \
  _tile_loadd(A, a.codes + r0 * a.k + (s * groups + (g)) * kGroup, a.k);       \
  _tile_loadd(3, codes[g][0], 4 * kLanes);                                     \
  _tile_zero(C0);                                                              \
  _tile_dpbsud(C0, A, 3);                                                      \
  if constexpr (C == 2) {                                                      \
    _tile_loadd(4, codes[g][1], 4 * kLanes);                                   \
    _tile_zero(C1);                                                            \
    _tile_dpbsud(C1, A, 4);                                                    \
  }
#define STRUCTSPEC_GROUP_STORE(C0, C1, g)                                       \
  _tile_stored(C0, dots[g][0], 4 * kLanes);                                    \
  if constexpr (C == 2) _tile_stored(C1, dots[g][1], 4 * kLanes);
      for (int64_t g = 0; g < groups; ++g) {
        if (g % 2 == 0) {
          STRUCTSPEC_GROUP_DOTS(2, 0, 1, g)
          if (g > 0) { STRUCTSPEC_GROUP_STORE(5, 6, g - 1) }
        } else {
          STRUCTSPEC_GROUP_DOTS(7, 5, 6, g)
          STRUCTSPEC_GROUP_STORE(0, 1, g - 1)
        }
      }
      if ((groups - 1) % 2 == 0) { STRUCTSPEC_GROUP_STORE(0, 1, groups - 1) }
      else { STRUCTSPEC_GROUP_STORE(5, 6, groups - 1) }
#undef STRUCTSPEC_GROUP_DOTS
#undef STRUCTSPEC_GROUP_STORE
      // The VNNI path's float steps, in K order: a block's 16 rows in registers, each group's scale and offset once.
      const float* sums = a.sums + r0 * sums_per_row + s * groups;
      for (int c = 0; c < C; ++c) {
        __m512 v[kRows];
        for (int r = 0; r < kRows; ++r) v[r] = _mm512_loadu_ps(acc + ((r0 + r) * C + c) * kLanes);
        for (int64_t g = 0; g < groups; ++g)
          for (int r = 0; r < kRows; ++r) {
            v[r] = _mm512_fmadd_ps(scale[g][c], _mm512_cvtepi32_ps(_mm512_load_si512(dots[g][c][r])), v[r]);
            v[r] = _mm512_fmadd_ps(offset[g][c], _mm512_set1_ps(sums[r * sums_per_row + g]), v[r]);
          }
        for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(acc + ((r0 + r) * C + c) * kLanes, v[r]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < C; ++c) vnni::write(job, r, c, _mm512_loadu_ps(acc + (r * C + c) * kLanes));
}

void run(const Tile& job) {
  const int64_t rows = job.n / kRows * kRows;
  if (rows > 0) {
    std::vector<float> acc(rows * job.width * kLanes, 0.f);
    configure();
    if (job.width == 2) tiles<2>(job, rows, acc.data());
    else tiles<1>(job, rows, acc.data());
    _tile_release();
  }
  vnni::run(job, rows);
}

}  // namespace amx
#pragma GCC pop_options

// ------------------------------------------------------------------------------------------------ dispatch

struct Path {
  const char* name;
  bool (*supported)();
  void (*quantize_row)(const float*, int64_t, int8_t*, float*, float*);
  void (*run)(const Tile&);
};

// In order of preference.
const Path kPaths[] = {
    {"amx", structspec::has_amx, vnni::quantize_row, amx::run},
    {"vnni", structspec::has_vnni, vnni::quantize_row, [](const Tile& job) { vnni::run(job); }},
    {"avx2", structspec::has_avx2, avx2::quantize_row, avx2::run},
    {"portable", structspec::always, portable::quantize_row, portable::run},
};

const Path& choose(const std::string& name) { return structspec::choose_path(kPaths, name, "int4_linear"); }

void check(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, int64_t groups) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "int4_linear: x must be a contiguous (n, in) float32 CPU tensor");
  TORCH_CHECK(groups >= 1 && groups <= kMaxGroups, "int4_linear: groups_per_block ", groups, " is not in 1..8");
  TORCH_CHECK(x.size(1) % (kGroup * groups) == 0,
              "int4_linear: in_features ", x.size(1), " is not a multiple of 32 x groups_per_block ", groups);
  const int64_t blocks = (out_features + kLanes - 1) / kLanes;
  const int64_t bytes = blocks * (x.size(1) / (kGroup * groups)) * superblock_bytes(groups);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == bytes,
              "int4_linear: packed weights of ", packed.numel(), " bytes, expected ", bytes, " uint8");
}

}  // namespace

// The paths this CPU can run, best first (the last is always "portable").
std::vector<std::string> int4_paths() { return structspec::supported_paths(kPaths); }

// x (n, in) float32; packed uint8 (`pack`); bias (out,) float32 or None; blocks: int64 column blocks to compute
// (output (n, 16 * len(blocks)), block j at columns 16 j..), or None: all (output (n, out)); path: "auto" or a name.
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features, int64_t groups, const c10::optional<at::Tensor>& blocks,
                       c10::string_view path_name) {
  check(x, packed, out_features, groups);
  const Path& path = choose(std::string(path_name));
  const int64_t n = x.size(0), k = x.size(1), supers = k / (kGroup * groups);
  const int64_t block_bytes = supers * superblock_bytes(groups);
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out_features,
                "int4_linear: bias must be (out,) float32");
    bias_data = bias->data_ptr<float>();
  }
  const structspec::Blocks chosen(blocks, out_features, kLanes, "int4_linear");
  const int64_t ldy = chosen.width(kLanes, out_features);
  at::Tensor y = chosen.subset ? at::zeros({n, ldy}, x.options()) : at::empty({n, ldy}, x.options());

  at::Tensor codes = at::empty({n, k}, x.options().dtype(at::kChar));
  at::Tensor sums = at::empty({n, k / kGroup}, x.options());
  at::Tensor scales = at::empty({n}, x.options());
  const float* xs = x.data_ptr<float>();
  int8_t* code_data = codes.data_ptr<int8_t>();
  float *sum_data = sums.data_ptr<float>(), *scale_data = scales.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      path.quantize_row(xs + r * k, k, code_data + r * k, sum_data + r * (k / kGroup), scale_data + r);
  });
  const Activations a{code_data, sum_data, scale_data, k};

  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* y_data = y.data_ptr<float>();
  const structspec::TilePlan plan(chosen.count);
  at::parallel_for(0, plan.tiles(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Tile job{&a, n, supers, groups, {nullptr, nullptr}, 0, {y_data, ldy, {nullptr, nullptr}, {0, 0}, {0, 0}}};
      job.width = plan.width(t);
      for (int c = 0; c < job.width; ++c) {
        const int64_t j = plan.block(t, c), block = chosen.data[j];
        job.w[c] = w + block * block_bytes;
        job.out.bias[c] = bias_data == nullptr ? nullptr : bias_data + block * kLanes;
        job.out.column[c] = chosen.column(j, kLanes);
        job.out.lanes[c] = static_cast<int>(std::min<int64_t>(kLanes, out_features - block * kLanes));
      }
      path.run(job);
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(structspec, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor? bias, int out_features, int groups_per_block, "
        "Tensor? blocks, str path='auto') -> Tensor");
  m.def("int4_paths() -> str[]", &int4_paths);
}

TORCH_LIBRARY_IMPL(structspec, CPU, m) { m.impl("int4_linear", &int4_linear); }
