// Row-invariant attention: every query row of every batch row against its own keys, in one call.
//
// structspec::row_invariant_attention(query (B, H, n, D), key (B, H_kv, L, D), value (B, H_kv, L, D),
//                                     mask (B or 1, n, L) bool or None, scale) -> (B, n, H, D), float32.
//
// Each (batch row b, head h, query row i) is one task: the scores of its attended keys in ascending key order,
// their max, exp(score - max) (`exp_lanes`), the sum and the weighted values, each reduced in one fixed order (keys
// ascending; the dot product over D in 16 lanes and a fixed tree). Nothing depends on n, B, the other rows or the number of
// threads (tasks are split over threads whole), so a row gives bitwise what it gives alone, in a prefill, a batch
// or a one-position step. A task whose row attends to no key (a padded query) gives zeros, as torch's sdpa does.
//
// Vectorised over D with GCC / Clang vector types (element-wise, so no sum is reassociated). On x86-64 Linux it is
// compiled for AVX-512, AVX2 and baseline x86-64, each with its own register width (STRUCTSPEC_PER_ISA, chosen at
// load time by the CPU; the 16 lane sums are the same lanes and the same tree at any width); -ffp-contract=off keeps
// every version's arithmetic the same (no fused multiply-add), so the ISA changes the speed only. Threads: at::parallel_for (OpenMP, hence -fopenmp) over whole tasks.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "vector_math.h"  // STRUCTSPEC_PER_ISA, INLINE, exp_lanes, load, store

namespace {

using structspec::kWidth;
using structspec::load;
using structspec::store;
constexpr int64_t kLanes = 16;  // a dot product's partial sums: lane l sums d = l, l + 16, ...
constexpr int64_t kKeys = 4;    // keys scored at once (independent sums: the same order as one at a time)
constexpr int64_t kBlock = 4;   // 16-column blocks of the output summed in registers while the keys stream past

template <class V> struct Sixteen {  // 16 lanes as 16 / W native vectors: part p holds lanes p W .. p W + W - 1
  static constexpr int64_t parts = kLanes / kWidth<V>;
  V part[parts];
};

// The lanes' sum in a fixed tree: 16 -> 8 -> 4 -> 2 -> 1 (lane l plus lane l + half), whatever the native width.
template <class V> INLINE float lane_sum(Sixteen<V> x) {
  for (int64_t n = Sixteen<V>::parts; n > 1; n /= 2)
    for (int64_t p = 0; p < n / 2; ++p) x.part[p] = x.part[p] + x.part[p + n / 2];
  float lanes[kWidth<V>];
  store(lanes, x.part[0]);
  for (int64_t n = kWidth<V>; n > 1; n /= 2)
    for (int64_t l = 0; l < n / 2; ++l) lanes[l] = lanes[l] + lanes[l + n / 2];
  return lanes[0];
}

// out[r] = q . k[r] for R keys: per key 16 lane sums in d order (a zero-padded last block), then `lane_sum`.
// Each key's sum is the same whatever R (the keys' sums never mix).
template <class V, int64_t R>
INLINE void dots(const float* q, const float* const* k, int64_t dim, float* out) {
  constexpr int64_t w = kWidth<V>;
  Sixteen<V> acc[R] = {};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes)
    for (int64_t p = 0; p < Sixteen<V>::parts; ++p) {
      const V x = load<V>(q + d + p * w);
      for (int64_t r = 0; r < R; ++r) acc[r].part[p] += x * load<V>(k[r] + d + p * w);
    }
  if (d < dim) {  // the last block, zero-padded to 16
    float x[kLanes] = {}, y[R][kLanes] = {};
    std::memcpy(x, q + d, (dim - d) * sizeof(float));
    for (int64_t r = 0; r < R; ++r) std::memcpy(y[r], k[r] + d, (dim - d) * sizeof(float));
    for (int64_t p = 0; p < Sixteen<V>::parts; ++p)
      for (int64_t r = 0; r < R; ++r) acc[r].part[p] += load<V>(x + p * w) * load<V>(y[r] + p * w);
  }
  for (int64_t r = 0; r < R; ++r) out[r] = lane_sum(acc[r]);
}

// out[c .. c + 16 C) = (sum over t, ascending, of p[t] * v[t][c ..]) / total: 16 C columns in registers.
template <class V, int64_t C>
INLINE void weighted(const float* p, const float* const* v, int64_t m, int64_t c, float total, float* out) {
  constexpr int64_t w = kWidth<V>, vectors = C * kLanes / w;
  V acc[vectors] = {};
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < vectors; ++j) acc[j] += p[t] * load<V>(v[t] + c + j * w);
  for (int64_t j = 0; j < vectors; ++j) store(out + c + j * w, acc[j] / total);
}

// The same sums for the last dim % 16 columns, one column at a time (the same arithmetic per column).
INLINE void weighted_tail(const float* p, const float* const* v, int64_t m, int64_t c, int64_t dim, float total,
                          float* out) {
  for (; c < dim; ++c) {
    float acc = 0.0f;
    for (int64_t t = 0; t < m; ++t) acc += p[t] * v[t][c];
    out[c] = acc / total;
  }
}

struct Rows {  // strides in elements; the last dim of query, key and value is contiguous
  const float *query, *key, *value;
  const bool* mask;  // nullptr: causal, query row i attends keys 0 .. L - n + i
  int64_t q_b, q_h, q_i, k_b, k_h, k_j, v_b, v_h, v_j, m_b, m_i, m_j;
  int64_t n, length, dim, groups;
  float scale;
};

struct Scratch {  // per thread: L entries each
  std::vector<float> scores;
  std::vector<const float*> keys, values;
  explicit Scratch(int64_t length) : scores(length), keys(length), values(length) {}
};

// The rows of key and value that (b, h, i) attends to, ascending; returns how many.
INLINE int64_t attended(const Rows& r, int64_t b, int64_t h, int64_t i, Scratch& s) {
  const float* k = r.key + b * r.k_b + (h / r.groups) * r.k_h;
  const float* v = r.value + b * r.v_b + (h / r.groups) * r.v_h;
  const bool* row = r.mask == nullptr ? nullptr : r.mask + b * r.m_b + i * r.m_i;
  const int64_t end = row == nullptr ? r.length - r.n + i + 1 : r.length;
  int64_t m = 0;
  for (int64_t j = 0; j < end; ++j) {
    if (row != nullptr && !row[j * r.m_j]) continue;
    s.keys[m] = k + j * r.k_j;
    s.values[m++] = v + j * r.v_j;
  }
  return m;
}

// scores[0 .. m) = exp(scores - top), a vector at a time (`exp_lanes`, the SiLU's exp); the last padded.
template <class V> INLINE void exp_shifted(float* scores, int64_t m, float top) {
  constexpr int64_t w = kWidth<V>;
  int64_t t = 0;
  for (; t + w <= m; t += w) store(scores + t, structspec::exp_lanes(load<V>(scores + t) - top));
  if (t == m) return;
  const V e = structspec::exp_lanes(structspec::load_tail<V>(scores + t, m - t) - top);
  std::memcpy(scores + t, &e, (m - t) * sizeof(float));
}

// One (b, h, i): out (D,) = softmax(scale * q . k_t over its attended keys t) . v_t; zeros if it attends none.
template <class V> INLINE void attend(const Rows& r, int64_t b, int64_t h, int64_t i, float* out, Scratch& s) {
  const int64_t m = attended(r, b, h, i, s);
  if (m == 0) {
    for (int64_t d = 0; d < r.dim; ++d) out[d] = 0.0f;
    return;
  }
  const float* q = r.query + b * r.q_b + h * r.q_h + i * r.q_i;
  float* scores = s.scores.data();
  int64_t t = 0;
  for (; t + kKeys <= m; t += kKeys) dots<V, kKeys>(q, &s.keys[t], r.dim, scores + t);
  for (; t < m; ++t) dots<V, 1>(q, &s.keys[t], r.dim, scores + t);
  float top = -std::numeric_limits<float>::infinity();
  for (t = 0; t < m; ++t) {
    scores[t] *= r.scale;
    top = scores[t] > top ? scores[t] : top;
  }
  exp_shifted<V>(scores, m, top);
  float total = 0.0f;
  for (t = 0; t < m; ++t) total += scores[t];
  const float* const* values = s.values.data();
  int64_t c = 0;
  for (; c + kBlock * kLanes <= r.dim; c += kBlock * kLanes) weighted<V, kBlock>(scores, values, m, c, total, out);
  for (; c + kLanes <= r.dim; c += kLanes) weighted<V, 1>(scores, values, m, c, total, out);
  weighted_tail(scores, values, m, c, r.dim, total, out);
}

STRUCTSPEC_PER_ISA(void, attend_one, (const Rows& r, int64_t b, int64_t h, int64_t i, float* out, Scratch& s),
                   attend<V>(r, b, h, i, out, s);)

at::Tensor row_invariant_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                   const std::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "query, key, value must be 4D");
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
              value.scalar_type() == at::kFloat, "query, key, value must be float32");
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && value.device().is_cpu(), "CPU tensors only");
  const int64_t batch = query.size(0), heads = query.size(1), n = query.size(2), dim = query.size(3);
  const int64_t kv_heads = key.size(1), length = key.size(2);
  TORCH_CHECK(key.sizes() == value.sizes(), "key and value differ in shape");
  TORCH_CHECK(key.size(0) == batch && key.size(3) == dim, "key is not (B, H_kv, L, D) for query (B, H, n, D)");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "query heads must be a multiple of key/value heads");
  const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
  const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
  Rows rows{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), nullptr,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), 0, 0, 0, n, length, dim, heads / kv_heads,
            static_cast<float>(scale)};
  if (mask.has_value()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 3, "mask must be bool (B, n, L)");
    TORCH_CHECK((m.size(0) == batch || m.size(0) == 1) && m.size(1) == n && m.size(2) == length,
                "mask is not (B or 1, n, L) for these query and key shapes");
    rows.mask = m.data_ptr<bool>();
    rows.m_b = m.size(0) == 1 ? 0 : m.stride(0);
    rows.m_i = m.stride(1);
    rows.m_j = m.stride(2);
  } else {
    TORCH_CHECK(length >= n, "without a mask the keys must include the n query positions (L >= n)");
  }
  at::Tensor out = at::empty({batch, n, heads, dim}, query.options().memory_format(at::MemoryFormat::Contiguous));
  float* base = out.data_ptr<float>();
  const int64_t tasks = batch * heads * n;  // task t: (b, h, i), i fastest (a head's tasks share its keys)
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, length * dim));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    Scratch scratch(length);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t % n, h = (t / n) % heads, b = t / (n * heads);
      attend_one(rows, b, h, i, base + ((b * n + i) * heads + h) * dim, scratch);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(structspec, m) {
  m.def("row_invariant_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(structspec, CPU, m) {
  m.impl("row_invariant_attention", &row_invariant_attention);
}
