// Row-invariant attention: every query row of every batch row against its own keys, in one call.
//
// structspec::row_invariant_attention(query (B, H, n, D), key (B, H_kv, L, D), value (B, H_kv, L, D),
//                                     mask (B or 1, n, L) bool or None, scale) -> (B, n, H, D), float32.
//
// Each (batch row b, query head h, query row i) is computed alone: the scores of its attended keys in ascending key
// order, their max, exp(score - max) (`exp_lanes`), the sum and the weighted values, each reduced in one fixed order
// (keys ascending; the dot product over D in 16 lanes and a fixed tree). The query heads of one key head (GQA) are
// computed side by side, each key and value row read once for several heads, but no sum ever mixes two heads. Nothing
// depends on n, B, the other rows or heads, or the number of threads (tasks are split over threads whole), so a row
// gives bitwise what it gives alone, in a prefill, a batch or a one-position step. A row that attends to no key (a
// padded query) gives zeros, as torch's sdpa does.
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
constexpr int64_t kTaskHeads = 8;  // query heads of one group a task computes (in runs of `kHeads` at once)

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

// Query heads scored together against each key and value they share (a GQA group): each key and value row is read
// once for up to this many heads (from the L1 cache rather than once a head from the L2), with the heads' sums in
// registers (16 lanes = `parts` native vectors a head).
template <class V> constexpr int64_t kHeads = 8 / Sixteen<V>::parts;  // AVX-512 8, AVX2 4, SSE 2

// scores[g][t] = q[g] . k[t] for Q heads and m keys: per (head, key) 16 lane sums in d order (a zero-padded last
// block), then `lane_sum`. A sum never mixes with another head's or key's, so it is the same whatever Q.
template <class V, int64_t Q>
INLINE void dots(const float* const* q, const float* const* k, int64_t m, int64_t dim, float* const* scores) {
  constexpr int64_t w = kWidth<V>, parts = Sixteen<V>::parts;
  const int64_t whole = dim - dim % kLanes;
  float x[Q][kLanes] = {};  // each head's last block, zero-padded
  for (int64_t g = 0; g < Q; ++g) std::memcpy(x[g], q[g] + whole, (dim - whole) * sizeof(float));
  for (int64_t t = 0; t < m; ++t) {
    Sixteen<V> acc[Q] = {};
    for (int64_t d = 0; d < whole; d += kLanes)
      for (int64_t p = 0; p < parts; ++p) {
        const V key = load<V>(k[t] + d + p * w);
        for (int64_t g = 0; g < Q; ++g) acc[g].part[p] += load<V>(q[g] + d + p * w) * key;
      }
    if (whole < dim) {
      float y[kLanes] = {};
      std::memcpy(y, k[t] + whole, (dim - whole) * sizeof(float));
      for (int64_t p = 0; p < parts; ++p)
        for (int64_t g = 0; g < Q; ++g) acc[g].part[p] += load<V>(x[g] + p * w) * load<V>(y + p * w);
    }
    for (int64_t g = 0; g < Q; ++g) scores[g][t] = lane_sum(acc[g]);
  }
}

// out[g][c .. c + 16) = (sum over t, ascending, of p[g][t] * v[t][c ..]) / total[g] for Q heads.
template <class V, int64_t Q>
INLINE void weighted(const float* const* p, const float* const* v, int64_t m, int64_t c, const float* total,
                     float* const* out) {
  constexpr int64_t w = kWidth<V>, parts = Sixteen<V>::parts;
  Sixteen<V> acc[Q] = {};
  for (int64_t t = 0; t < m; ++t)
    for (int64_t j = 0; j < parts; ++j) {
      const V value = load<V>(v[t] + c + j * w);
      for (int64_t g = 0; g < Q; ++g) acc[g].part[j] += p[g][t] * value;
    }
  for (int64_t g = 0; g < Q; ++g)
    for (int64_t j = 0; j < parts; ++j) store(out[g] + c + j * w, acc[g].part[j] / total[g]);
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
  int64_t n, length, dim, groups, heads;
  float scale;
};

struct Scratch {  // per thread: L entries each, scores L a head
  std::vector<float> scores;
  std::vector<const float*> keys, values;
  explicit Scratch(int64_t length) : scores(kTaskHeads * length), keys(length), values(length) {}
};

// The rows of key and value that (b, key head, i) attends to, ascending; returns how many.
INLINE int64_t attended(const Rows& r, int64_t b, int64_t kv, int64_t i, Scratch& s) {
  const float* k = r.key + b * r.k_b + kv * r.k_h;
  const float* v = r.value + b * r.v_b + kv * r.v_h;
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

// scores[0 .. m) = exp(scale * scores - their max); returns their sum, in ascending order.
template <class V> INLINE float softmax_numerators(float* scores, int64_t m, float scale) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < m; ++t) {
    scores[t] *= scale;
    top = scores[t] > top ? scores[t] : top;
  }
  exp_shifted<V>(scores, m, top);
  float total = 0.0f;
  for (int64_t t = 0; t < m; ++t) total += scores[t];
  return total;
}

// Q query heads h0 .. h0 + Q - 1 of one group, at (b, i), over the m keys and values in `s`: out (D,) a head =
// softmax(scale * q . k_t over the keys t) . v_t. Each head's numbers take the steps they would alone.
template <class V, int64_t Q>
INLINE void attend_heads(const Rows& r, int64_t b, int64_t h0, int64_t i, int64_t m, float* base, Scratch& s) {
  const float* q[Q];
  float *scores[Q], *out[Q], total[Q];
  for (int64_t g = 0; g < Q; ++g) {
    q[g] = r.query + b * r.q_b + (h0 + g) * r.q_h + i * r.q_i;
    scores[g] = s.scores.data() + g * r.length;
    out[g] = base + ((b * r.n + i) * r.heads + h0 + g) * r.dim;
  }
  dots<V, Q>(q, s.keys.data(), m, r.dim, scores);
  for (int64_t g = 0; g < Q; ++g) total[g] = softmax_numerators<V>(scores[g], m, r.scale);
  const float* const* values = s.values.data();
  int64_t c = 0;
  for (; c + kLanes <= r.dim; c += kLanes) weighted<V, Q>(scores, values, m, c, total, out);
  for (int64_t g = 0; g < Q; ++g) weighted_tail(scores[g], values, m, c, r.dim, total[g], out[g]);
}

// Query heads h0 .. h0 + count - 1 (count <= kTaskHeads) of one group at (b, i), `kHeads` at a time; zeros for a
// row that attends no key, as torch's sdpa gives.
template <class V> INLINE void attend(const Rows& r, int64_t b, int64_t h0, int64_t count, int64_t i, float* base,
                                      Scratch& s) {
  const int64_t m = attended(r, b, h0 / r.groups, i, s);
  if (m == 0) {
    for (int64_t h = h0; h < h0 + count; ++h) std::fill_n(base + ((b * r.n + i) * r.heads + h) * r.dim, r.dim, 0.0f);
    return;
  }
  for (int64_t h = h0; h < h0 + count;) {
    const int64_t run = std::min(kHeads<V>, h0 + count - h);
    switch (run) {  // kHeads<V> is at most 8
      case 8: attend_heads<V, std::min<int64_t>(8, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 7: attend_heads<V, std::min<int64_t>(7, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 6: attend_heads<V, std::min<int64_t>(6, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 5: attend_heads<V, std::min<int64_t>(5, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 4: attend_heads<V, std::min<int64_t>(4, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 3: attend_heads<V, std::min<int64_t>(3, kHeads<V>)>(r, b, h, i, m, base, s); break;
      case 2: attend_heads<V, std::min<int64_t>(2, kHeads<V>)>(r, b, h, i, m, base, s); break;
      default: attend_heads<V, 1>(r, b, h, i, m, base, s); break;
    }
    h += run;
  }
}

STRUCTSPEC_PER_ISA(void, attend_some, (const Rows& r, int64_t b, int64_t h0, int64_t count, int64_t i, float* base,
                                       Scratch& s),
                   attend<V>(r, b, h0, count, i, base, s);)

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
            v.stride(0), v.stride(1), v.stride(2), 0, 0, 0, n, length, dim, heads / kv_heads, heads,
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
  // task t: (b, key head, run of up to kTaskHeads of its query heads, i), i fastest (a group's tasks share its keys)
  const int64_t groups = rows.groups, runs = (groups + kTaskHeads - 1) / kTaskHeads;
  const int64_t tasks = batch * kv_heads * runs * n;
  const int64_t grain =
      std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, length * dim * std::min(groups, kTaskHeads)));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    Scratch scratch(length);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t % n, run = (t / n) % runs, kv = (t / (n * runs)) % kv_heads, b = t / (n * runs * kv_heads);
      const int64_t h0 = kv * groups + run * kTaskHeads;
      attend_some(rows, b, h0, std::min(kTaskHeads, groups - run * kTaskHeads), i, base, scratch);
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
