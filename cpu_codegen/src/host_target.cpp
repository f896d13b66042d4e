// The running machine as a scheduling target (cpu.h): cache sizes from sysconf, threads from the hardware,
// and the widest SIMD registers of the CPU this process runs on -- the JIT targets it, not the CPU this
// file was compiled for.
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "polytile/cpu.h"

namespace polytile::cpu {

sched::Target host_target() {
  sched::Target t;
  t.name = "host";
  long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l1 > 0) t.cpu.l1_bytes = l1;
  if (l2 > 0) t.cpu.l2_bytes = l2;
  t.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool avx512 = __builtin_cpu_supports("avx512f");
  t.cpu.vector_bits = avx512 ? 512 : __builtin_cpu_supports("avx2") ? 256 : 128;
  t.cpu.vector_registers = avx512 ? 32 : 16;  // zmm0-31 with AVX-512, else ymm/xmm0-15
  return t;
}

}  // namespace polytile::cpu
