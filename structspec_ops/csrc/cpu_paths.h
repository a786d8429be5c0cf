// The instruction-set paths of the quantized linears, chosen per call by the CPU's cpuid (no /proc/cpuinfo).
// Each op lists its paths best first, the last ("portable") supported everywhere; every path of an op gives bitwise
// the same output, so the choice changes speed only.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
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

inline bool always() { return true; }

// The path `name` asks for ("auto": the best this CPU runs) among `paths` (each with .name and .supported()).
template <typename Path, std::size_t N>
const Path& choose_path(const Path (&paths)[N], const std::string& name, const char* op) {
  for (const Path& path : paths)
    if (name == "auto" ? path.supported() : name == path.name) {
      TORCH_CHECK(path.supported(), op, ": this CPU cannot run the '", name, "' path");
      return path;
    }
  TORCH_CHECK(false, op, ": unknown path '", name, "' (auto, vnni, avx2 or portable)");
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

}  // namespace structspec
