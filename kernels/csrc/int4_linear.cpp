// y = x W^T + b with 4-bit weights in groups of 32 and per-row int8 activations (AVX-512 VNNI), row-invariant.
//
// Weights: each group of 32 inputs of one output column is  scale * q + offset,  q in 0..15, with
//   scale = d * sc   and   offset = -(dmin * m)
// where d, dmin are float32 per super-block of G groups (Q4_K: G = 8) and sc, m are bytes per group (Q4_K's 6-bit
// ones; Q4_0, Q4_1 and float scales: G = 1, sc = m = 1).
// Activations: each row is quantized inside the op with its own max-abs scale to codes a in -127..127.
// Per (row, column, group): dot = sum q * a (int32, vpdpbusd: the weights are the u8 operand) and the row's
// int32 sum of its codes; the groups are added in float in K order:
//   acc = fma(scale, dot, acc); acc = fma(offset, sum, acc)      y = fma(acc, row scale, bias)
// Every output lane runs that sequence whatever the number of rows, the row tile, the column tile, the thread
// split (by output columns) or the columns asked for: a row's result cannot depend on anything else in the call.
//
// Packed layout (kernels/int4.py `pack`): column blocks of 16 lanes, each one stream of super-blocks:
//   [d: 16 f32][dmin: 16 f32][sc: G x 16 u8][m: G x 16 u8][codes: G x 256 u8]
// where a group's 256 code bytes are 4 vectors of 64; byte 4 * lane + b of vector i holds, in its low nibble, the
// code of input 4 i + b and, in its high nibble, that of input 16 + 4 i + b (of that lane's column).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>

namespace {

constexpr int64_t kLanes = 16;       // output columns per block: one zmm of int32 or float
constexpr int64_t kGroup = 32;       // inputs per group
constexpr int64_t kCodeBytes = 256;  // code bytes per (block, group): 16 lanes x 32 inputs x 4 bits
constexpr int kMaxRows = 4;          // rows per register tile
constexpr int kMaxBlocks = 2;        // column blocks per register tile

int64_t superblock_bytes(int64_t groups) { return 2 * 64 + groups * (2 * kLanes + kCodeBytes); }

// Per-row int8 activations and what each group needs of them.
struct Activations {
  const int8_t* codes;   // (n, K)
  const float* sums;     // (n, K / 32): the int32 sum of each group's codes, as float (exact)
  const float* scales;   // (n,): max-abs / 127
  int64_t k;
};

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
  __builtin_memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

inline __m512 widen(const uint8_t* p) {  // 16 bytes -> 16 floats
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Where a tile writes: per column block, its output column, bias and the lanes that exist.
struct Outputs {
  float* y;         // (n, ldy)
  int64_t ldy;
  const float* bias[kMaxBlocks];  // per block: 16 values, or nullptr
  int64_t column[kMaxBlocks];     // per block: its first column in y
  __mmask16 lanes[kMaxBlocks];
};

// R rows (from r0) times C column blocks, over the whole K.
template <int R, int C>
void tile(const Activations& a, int64_t r0, const uint8_t* const* w, int64_t supers, int64_t groups,
          const Outputs& out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t stride = superblock_bytes(groups);
  const int64_t sums_per_row = a.k / kGroup;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* base[C];
    __m512 d[C], neg_dmin[C];
    for (int c = 0; c < C; ++c) {
      base[c] = w[c] + s * stride;
      d[c] = _mm512_loadu_ps(reinterpret_cast<const float*>(base[c]));
      neg_dmin[c] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(reinterpret_cast<const float*>(base[c] + 64)));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t group = s * groups + g;  // in K order
      const int64_t k0 = group * kGroup;
      __m512i dot[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) dot[r][c] = _mm512_setzero_si512();
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
            dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], hi[c], a_hi);
          }
        }
      }
      __m512 scale[C], offset[C];
      for (int c = 0; c < C; ++c) {
        scale[c] = _mm512_mul_ps(d[c], widen(base[c] + 128 + kLanes * g));  // d * sc (exact for fp16 d)
        offset[c] = _mm512_mul_ps(neg_dmin[c], widen(base[c] + 128 + kLanes * (groups + g)));  // -dmin * m
      }
      for (int r = 0; r < R; ++r) {
        const __m512 sum = _mm512_set1_ps(a.sums[(r0 + r) * sums_per_row + group]);
        for (int c = 0; c < C; ++c) {
          acc[r][c] = _mm512_fmadd_ps(scale[c], _mm512_cvtepi32_ps(dot[r][c]), acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(offset[c], sum, acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 row_scale = _mm512_set1_ps(a.scales[r0 + r]);
    for (int c = 0; c < C; ++c) {
      float* y = out.y + (r0 + r) * out.ldy + out.column[c];
      const __m512 v = out.bias[c] == nullptr
                           ? _mm512_mul_ps(acc[r][c], row_scale)
                           : _mm512_fmadd_ps(acc[r][c], row_scale, _mm512_maskz_loadu_ps(out.lanes[c], out.bias[c]));
      _mm512_mask_storeu_ps(y, out.lanes[c], v);
    }
  }
}

template <int C>
void rows_of(const Activations& a, int64_t n, const uint8_t* const* w, int64_t supers, int64_t groups,
             const Outputs& out) {
  // Tiles of 4 rows; 4 + 1 rows as one tile of 5 (a single row would unpack the weights again for itself alone:
  // a verify of 4 drafts has 5 rows); the last rows in a smaller tile. Every tile: the same per-lane sequence.
  const int64_t fours = n % kMaxRows == 1 && n > kMaxRows ? n - kMaxRows - 1 : n;
  int64_t r0 = 0;
  for (; r0 + kMaxRows <= fours; r0 += kMaxRows) tile<kMaxRows, C>(a, r0, w, supers, groups, out);
  switch (n - r0) {
    case 5: tile<kMaxRows + 1, C>(a, r0, w, supers, groups, out); break;
    case 3: tile<3, C>(a, r0, w, supers, groups, out); break;
    case 2: tile<2, C>(a, r0, w, supers, groups, out); break;
    case 1: tile<1, C>(a, r0, w, supers, groups, out); break;
    default: break;
  }
}

void check(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, int64_t groups) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "int4_linear: x must be a contiguous (n, in) float32 CPU tensor");
  TORCH_CHECK(groups >= 1 && x.size(1) % (kGroup * groups) == 0,
              "int4_linear: in_features ", x.size(1), " is not a multiple of 32 x groups_per_block ", groups);
  const int64_t blocks = (out_features + kLanes - 1) / kLanes;
  const int64_t bytes = blocks * (x.size(1) / (kGroup * groups)) * superblock_bytes(groups);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == bytes,
              "int4_linear: packed weights of ", packed.numel(), " bytes, expected ", bytes, " uint8");
}

}  // namespace

// x (n, in) float32; packed uint8 (`pack`); bias (out,) float32 or None; blocks: int64 column blocks to compute
// (output (n, 16 * len(blocks)), block j at columns 16 j..), or None: all (output (n, out)).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features, int64_t groups, const c10::optional<at::Tensor>& blocks) {
  check(x, packed, out_features, groups);
  const int64_t n = x.size(0), k = x.size(1), supers = k / (kGroup * groups);
  const int64_t block_bytes = supers * superblock_bytes(groups);
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == out_features,
                "int4_linear: bias must be (out,) float32");
    bias_data = bias->data_ptr<float>();
  }
  at::Tensor chosen = blocks.has_value() && blocks->defined()
                          ? blocks->to(at::kLong).contiguous()
                          : at::arange((out_features + kLanes - 1) / kLanes, at::kLong);
  const int64_t* block_ids = chosen.data_ptr<int64_t>();
  const int64_t count = chosen.numel();
  const bool subset = blocks.has_value() && blocks->defined();
  for (int64_t j = 0; j < count; ++j)
    TORCH_CHECK(block_ids[j] >= 0 && block_ids[j] * kLanes < out_features, "int4_linear: column block ",
                block_ids[j], " out of range");
  at::Tensor y = subset ? at::zeros({n, count * kLanes}, x.options()) : at::empty({n, out_features}, x.options());

  at::Tensor codes = at::empty({n, k}, x.options().dtype(at::kChar));
  at::Tensor sums = at::empty({n, k / kGroup}, x.options());
  at::Tensor scales = at::empty({n}, x.options());
  const float* xs = x.data_ptr<float>();
  int8_t* code_data = codes.data_ptr<int8_t>();
  float *sum_data = sums.data_ptr<float>(), *scale_data = scales.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row(xs + r * k, k, code_data + r * k, sum_data + r * (k / kGroup), scale_data + r);
  });
  const Activations a{code_data, sum_data, scale_data, k};

  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* y_data = y.data_ptr<float>();
  const int64_t ldy = subset ? count * kLanes : out_features;
  const int64_t tiles = (count + kMaxBlocks - 1) / kMaxBlocks;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int width = static_cast<int>(std::min<int64_t>(kMaxBlocks, count - t * kMaxBlocks));
      const uint8_t* streams[kMaxBlocks];
      Outputs out{y_data, ldy, {nullptr, nullptr}, {0, 0}, {0, 0}};
      for (int c = 0; c < width; ++c) {
        const int64_t j = t * kMaxBlocks + c, block = block_ids[j];
        const int64_t valid = std::min<int64_t>(kLanes, out_features - block * kLanes);
        streams[c] = w + block * block_bytes;
        out.bias[c] = bias_data == nullptr ? nullptr : bias_data + block * kLanes;
        out.column[c] = subset ? j * kLanes : block * kLanes;
        out.lanes[c] = static_cast<__mmask16>((1u << valid) - 1u);
      }
      if (width == 2) rows_of<2>(a, n, streams, supers, groups, out);
      else rows_of<1>(a, n, streams, supers, groups, out);
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(structspec, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor? bias, int out_features, int groups_per_block, "
        "Tensor? blocks) -> Tensor");
}

TORCH_LIBRARY_IMPL(structspec, CPU, m) { m.impl("int4_linear", &int4_linear); }
