// The instruction-set paths of the quantized linears, chosen per call by the CPU's cpuid (no /proc/cpuinfo).
// Each op lists its paths best first, the last ("portable") supported everywhere; every path of an op gives bitwise
// the same output, so the choice changes speed only.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace structspec {

inline bool has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
}

inline bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// AMX-INT8 tiles (cpuid leaf 7: AMX-TILE, AMX-INT8) that this process may use: Linux hands out the tile data state
// only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), asked once per process here.
inline bool has_amx() {
  static const bool granted = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tiles = (d >> 24 & 1) && (d >> 25 & 1);  // AMX-TILE, AMX-INT8
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return tiles && has_vnni() && syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return granted;
}

inline bool always() { return true; }

// The path `name` asks for ("auto": the best this CPU runs) among `paths` (each with .name and .supported()).
template <typename Path, std::size_t N>
const Path& choose_path(const Path (&paths)[N], const std::string& name, const char* op) {
  for (const Path& path : paths)
    if (name == "auto" ? path.supported() : name == path.name) {
      TORCH_CHECK(path.supported(), op, ": this CPU cannot run the '", name, "' path");
      return path;
    }
  TORCH_CHECK(false, op, ": unknown path '", name, "' (auto, amx, vnni, avx2 or portable)");
  return paths[N - 1];  // not reached
}

// The names of the paths this CPU runs, best first.
template <typename Path, std::size_t N>
std::vector<std::string> supported_paths(const Path (&paths)[N]) {
  std::vector<std::string> names;
  for (const Path& path : paths)
    if (path.supported()) names.emplace_back(path.name);
  return names;
}

// Which column blocks each tile of a call computes: a tile is block j and block j + half (one block for the last
// of an odd count), and threads take contiguous runs of tiles, so each thread reads two long sequential streams of
// the weight (blocks are stored one after another) and each activation load serves two blocks. Pairing adjacent
// blocks instead restarts both streams every tile, where the hardware prefetchers lose time: on a Zen 4, the one-row
// step of Qwen2.5-Coder 1.5B's int4 target ran 1.34x faster at one thread and 1.18x at two with distant pairs
// (paired, interleaved, 20 steps each; reading one block a tile, a single stream, was in between: 1.24x, 1.14x).
// Which tile a block lands in never changes its lanes' sequence of operations: the plan changes speed only.
class TilePlan {
 public:
  explicit TilePlan(int64_t blocks) : blocks_(blocks), half_((blocks + 1) / 2) {}

  int64_t tiles() const { return half_; }
  int width(int64_t tile) const { return tile + half_ < blocks_ ? 2 : 1; }
  int64_t block(int64_t tile, int c) const { return tile + c * half_; }  // an index into the call's blocks

 private:
  int64_t blocks_, half_;
};

// The 16-column blocks a linear's call computes: `blocks` (int64 indices, each below out_features / 16 rounded up)
// where given, its output (n, 16 * count) with block j at columns 16 j..; else every block, output (n, out_features).
struct Blocks {
  at::Tensor ids;  // (count,) int64
  const int64_t* data;
  int64_t count;
  bool subset;

  Blocks(const c10::optional<at::Tensor>& blocks, int64_t out_features, int64_t lanes, const char* op)
      : subset(blocks.has_value() && blocks->defined()) {
    ids = subset ? blocks->to(at::kLong).contiguous() : at::arange((out_features + lanes - 1) / lanes, at::kLong);
    data = ids.data_ptr<int64_t>();
    count = ids.numel();
    for (int64_t j = 0; j < count; ++j)
      TORCH_CHECK(data[j] >= 0 && data[j] * lanes < out_features, op, ": column block ", data[j], " out of range");
  }

  int64_t width(int64_t lanes, int64_t out_features) const { return subset ? count * lanes : out_features; }
  int64_t column(int64_t j, int64_t lanes) const { return (subset ? j : data[j]) * lanes; }  // of block j in y
};

}  // namespace structspec
