// The running machine as a scheduling target (cpu.h): cache sizes from sysconf (the L3's from Linux's
// sysfs first), threads from the hardware, and the widest SIMD registers of the CPU this process runs on --
// the JIT targets it, not the CPU this file was compiled for.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

#include "polytile/cpu.h"

#include <llvm/ADT/StringRef.h>
#include <llvm/TargetParser/Host.h>

namespace polytile::cpu {

namespace {

// The size of the level-`level` cache of CPU 0 as Linux describes it (sysfs: "32768K"), 0 where it does
// not. glibc's sysconf reports an AMD processor's L3 for the whole package (320 MiB on a 2-core virtual
// EPYC whose cores share one 32 MiB L3); the kernel's cache information names the one the cores share.
long sysfs_cache_bytes(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int l = 0;
    std::string size;
    if (!(level_file >> l) || l != level || !(size_file >> size)) continue;
    try {
      size_t end = 0;
      const long value = std::stol(size, &end);
      const char unit = end < size.size() ? size[end] : ' ';
      return unit == 'K' ? value << 10 : unit == 'M' ? value << 20 : value;
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

sched::Target host_target() {
  sched::Target t;
  t.name = "host";
  long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysfs_cache_bytes(3);
  if (l1 > 0) t.cpu.l1_bytes = l1;
  if (l2 > 0) t.cpu.l2_bytes = l2;
  if (l3 <= 0) l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) t.cpu.l3_bytes = l3;
  t.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool avx512 = __builtin_cpu_supports("avx512f");
  t.cpu.vector_bits = avx512 ? 512 : __builtin_cpu_supports("avx2") ? 256 : 128;
  t.cpu.vector_registers = avx512 ? 32 : 16;  // zmm0-31 with AVX-512, else ymm/xmm0-15
  // Zen 4 runs a 512-bit FMA as two halves on its two 256-bit pipes: one per cycle, where Intel's cores
  // (and Zen 5) issue two. The micro-kernel plan then counts a block's FMAs twice as dear against its loads
  // and loop overhead, which turns a 128-channel conv weight gradient's 6 x 4 blocks (21 of 6 channels
  // and a partial one of 2) into 4 x 4 ones (32 of 4).
  t.cpu.fma_per_cycle = avx512 && llvm::sys::getHostCPUName() == "znver4" ? 1 : 2;
  // Stores past the caches (CpuModel::stream_stores) pay on AMD's cores and cost on Intel's: on a 2-core
  // Zen 4 guest max pool's gradient ran 1.15-1.30x and the 1x1 conv's data gradient 1.06-1.09x as fast
  // with them; on a 2-core Cascade Lake guest 0.81x and 0.92x, softmax forward and backward 0.84x and
  // 0.85x (interleaved, best of 5 each). Off where the vendor is not AMD.
  t.cpu.stream_stores = __builtin_cpu_is("amd");
  return t;
}

}  // namespace polytile::cpu
