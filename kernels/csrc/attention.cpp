// Row-invariant attention: every query row of every batch row against its own keys, in one call.
//
// structspec::row_invariant_attention(query (B, H, n, D), key (B, H_kv, L, D), value (B, H_kv, L, D),
//                                     mask (B or 1, n, L) bool or None, scale) -> (B, n, H, D), float32.
//
// Each (batch row b, head h, query row i) is one task: the scores of its attended keys in ascending key order,
// their max, exp(score - max), the sum and the weighted values, each reduced in one fixed order (keys ascending;
// the dot product over D in 16 lanes and a fixed tree). Nothing depends on n, B, the other rows or the number of
// threads (tasks are split over threads whole), so a row gives bitwise what it gives alone, in a prefill, a batch
// or a one-position step. A task whose row attends to no key (a padded query) gives zeros, as torch's sdpa does.
//
// Vectorised over D by the compiler: the lanes are independent sums (no reassociation), built for AVX-512, AVX2
// and baseline x86-64 (target_clones, chosen at load time by the CPU); -ffp-contract=off keeps every build's
// arithmetic the same (no fused multiply-add).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define STRUCTSPEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef STRUCTSPEC_CLONES
#define STRUCTSPEC_CLONES
#endif

namespace {

constexpr int64_t kLanes = 16;

// sum over d of a[d] * b[d]: lane l sums d = l, l + 16, ...; then lanes 16 -> 8 -> 4 -> 2 -> 1.
inline float dot(const float* a, const float* b, int64_t dim) {
  float acc[kLanes] = {0};
  int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[d + l] * b[d + l];
  for (int64_t l = 0; d < dim; ++d, ++l) acc[l] += a[d] * b[d];
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

struct Rows {  // strides in elements; the last dim of query, key and value is contiguous
  const float *query, *key, *value;
  const bool* mask;  // nullptr: causal, query row i attends keys 0 .. L - n + i
  int64_t q_b, q_h, q_i, k_b, k_h, k_j, v_b, v_h, v_j, m_b, m_i, m_j;
  int64_t n, length, dim, groups;
  float scale;
};

// One (b, h, i): out (D,) = softmax(scale * q . k_j over attended j) . v_j. `scores` holds L floats, `keys` L ints.
STRUCTSPEC_CLONES
void attend_one(const Rows& r, int64_t b, int64_t h, int64_t i, float* out, float* scores, int64_t* keys) {
  const float* q = r.query + b * r.q_b + h * r.q_h + i * r.q_i;
  const float* k = r.key + b * r.k_b + (h / r.groups) * r.k_h;
  const float* v = r.value + b * r.v_b + (h / r.groups) * r.v_h;
  int64_t m = 0;
  if (r.mask == nullptr) {
    for (int64_t j = 0; j <= r.length - r.n + i; ++j) keys[m++] = j;
  } else {
    const bool* row = r.mask + b * r.m_b + i * r.m_i;
    for (int64_t j = 0; j < r.length; ++j)
      if (row[j * r.m_j]) keys[m++] = j;
  }
  for (int64_t d = 0; d < r.dim; ++d) out[d] = 0.0f;
  if (m == 0) return;
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < m; ++t) {
    scores[t] = dot(q, k + keys[t] * r.k_j, r.dim) * r.scale;
    top = scores[t] > top ? scores[t] : top;
  }
  float total = 0.0f;
  for (int64_t t = 0; t < m; ++t) {
    const float p = std::exp(scores[t] - top);
    const float* vj = v + keys[t] * r.v_j;
    total += p;
    for (int64_t d = 0; d < r.dim; ++d) out[d] += p * vj[d];
  }
  for (int64_t d = 0; d < r.dim; ++d) out[d] /= total;
}

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
  at::parallel_for(0, tasks, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(length);
    std::vector<int64_t> keys(length);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t % n, h = (t / n) % heads, b = t / (n * heads);
      attend_one(rows, b, h, i, base + ((b * n + i) * heads + h) * dim, scores.data(), keys.data());
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
