// The running machine as a scheduling target (cpu.h): cache sizes from sysconf (the L3's from Linux's
// sysfs first), threads from the hardware, and the widest SIMD registers of the CPU this process runs on --
// the JIT targets it, not the CPU this file was compiled for.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "internal.h"
#include "polytile/cpu.h"
#include "polytile/error.h"

#include <llvm/ADT/StringMap.h>
#include <llvm/ADT/StringRef.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/TargetParser/Host.h>

namespace polytile::cpu {

namespace {

// A cache size as a CPU spec (cpu_target) or Linux's sysfs writes it: bytes, or a count of KiB, MiB or GiB
// ("48K", "32768K", "1M"; the suffix in either case), from 1 KiB to 1 TiB; nullopt for anything else.
std::optional<int64_t> cache_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 13 || text.size() > digits + 1) return std::nullopt;
  int64_t bytes = std::stoll(text.substr(0, digits));
  if (digits < text.size()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text[digits])));
    const int shift = unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : -1;
    if (shift < 0 || bytes > (int64_t{1} << 40) >> shift) return std::nullopt;
    bytes <<= shift;
  }
  if (bytes < 1024 || bytes > int64_t{1} << 40) return std::nullopt;
  return bytes;
}

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
    return static_cast<long>(cache_size(size).value_or(0));
  }
  return 0;
}

// The instruction-set features LLVM reads from this machine ("avx512f" -> true, "amx-tile" -> false).
const llvm::StringMap<bool>& host_features() {
  static const llvm::StringMap<bool> features = [] {
    llvm::StringMap<bool> f;
    llvm::sys::getHostCPUFeatures(f);
    return f;
  }();
  return features;
}

// The same features of the x86 CPU `name`, from LLVM's description of it; UserError for a name it does
// not know (asked first: LLVM only warns on stderr and falls back to a generic CPU). Kept per name: every
// compile() for a named CPU asks (check_runs_here), and so does every target machine made for it.
std::map<std::string, bool> read_cpu_features(const std::string& name) {
  const std::string triple = llvm::sys::getProcessTriple();
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target) throw InternalError("LLVM has no target for " + triple + ": " + error);
  std::unique_ptr<llvm::MCSubtargetInfo> generic(target->createMCSubtargetInfo(triple, "", ""));
  if (!generic || !generic->isCPUStringValid(name))
    user_error("unknown CPU '", name, "': give a CPU as LLVM names it (znver3, znver4, haswell, skylake-avx512, ",
               "x86-64-v3, ...; llc -mcpu=help lists them) or host");
  std::unique_ptr<llvm::MCSubtargetInfo> cpu(target->createMCSubtargetInfo(triple, name, ""));
  std::map<std::string, bool> out;
  for (const auto& feature : host_features()) out[feature.getKey().str()] = cpu->checkFeatures("+" + feature.getKey().str());
  return out;
}

const std::map<std::string, bool>& named_cpu_features(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::map<std::string, bool>> known;
  initialize_llvm();
  std::lock_guard<std::mutex> guard(mutex);
  if (auto it = known.find(name); it != known.end()) return it->second;
  return known.emplace(name, read_cpu_features(name)).first->second;  // an unknown name throws, kept nowhere
}

// What the instruction set gives the micro-kernel plan (`has`: whether the CPU has a feature), for the
// CPU LLVM calls `cpu`: the widest vectors, their registers and the FMAs a cycle.
void set_instruction_set(sched::CpuModel& m, const std::function<bool(const char*)>& has, const std::string& cpu) {
  const bool avx512 = has("avx512f");
  m.vector_bits = avx512 ? 512 : has("avx2") ? 256 : 128;
  m.vector_registers = avx512 ? 32 : 16;  // zmm0-31 with AVX-512, else ymm/xmm0-15
  // Zen 4 runs a 512-bit FMA as two halves on its two 256-bit pipes: one per cycle, where Intel's cores
  // (and Zen 5) issue two. The micro-kernel plan then counts a block's FMAs twice as dear against its loads
  // and loop overhead, which turns a 128-channel conv weight gradient's 6 x 4 blocks (21 of 6 channels
  // and a partial one of 2) into 4 x 4 ones (32 of 4).
  m.fma_per_cycle = avx512 && cpu == "znver4" ? 1 : 2;
  m.pack_within_l2 = cpu.rfind("znver", 0) != 0;  // measured both ways (plan.cpp, pack_vector_operand)
}

// Whether code polytile makes may use feature `f`: the vector, bit-manipulation and arithmetic
// extensions LLVM selects instructions from on its own. The rest (pku, mwaitx, wbnoinvd, serialize, ...)
// are system instructions no compiled program contains: a guest whose hypervisor hides them still runs
// the code of its CPU's name.
bool code_feature(const std::string& f) {
  for (const char* prefix : {"sse", "ssse", "avx", "amx", "fma", "f16c", "bmi", "lzcnt", "popcnt", "movbe", "xop",
                             "aes", "vaes", "pclmul", "vpclmulqdq", "gfni", "sha", "adx", "tbm", "prfchw", "cx16",
                             "sahf", "cmov", "cx8", "mmx", "x87", "crc32"})
    if (f.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

std::string cpu_feature_string(const std::string& name) {
  std::string out;
  for (const auto& [feature, on] : named_cpu_features(name)) out += (out.empty() ? "" : ",") + std::string(on ? "+" : "-") + feature;
  return out;
}

std::vector<std::string> missing_cpu_features(const std::string& name) {
  std::vector<std::string> missing;
  if (name.empty() || name == "host") return missing;
  for (const auto& [feature, on] : named_cpu_features(name))
    if (on && code_feature(feature) && !host_features().lookup(feature)) missing.push_back(feature);
  return missing;
}

sched::Target host_target() {
  sched::Target t;
  t.name = "host";
  long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysfs_cache_bytes(3);
  if (l1 > 0) t.cpu.l1_bytes = l1;
  if (l2 > 0) t.cpu.l2_bytes = l2;
  if (l3 <= 0) l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) t.cpu.l3_bytes = l3;
  t.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_instruction_set(t.cpu, [](const char* f) { return host_features().lookup(f); }, llvm::sys::getHostCPUName().str());
  // Stores past the caches (CpuModel::stream_stores) pay on AMD's cores and cost on Intel's: on a 2-core
  // Zen 4 guest max pool's gradient ran 1.15-1.30x and the 1x1 conv's data gradient 1.06-1.09x as fast
  // with them; on a 2-core Cascade Lake guest 0.81x and 0.92x, softmax forward and backward 0.84x and
  // 0.85x (interleaved, best of 5 each). Off where the vendor is not AMD.
  t.cpu.stream_stores = __builtin_cpu_is("amd");
  return t;
}

sched::Target cpu_target(const std::string& spec) {
  // NAME[,l1=SIZE][,l2=SIZE][,l3=SIZE]: the name up to the first comma, then the caches it overrides.
  const size_t comma = spec.find(',');
  const std::string name = spec.substr(0, comma);
  sched::Target t = host_target();
  if (!name.empty() && name != "host") {
    const std::map<std::string, bool>& features = named_cpu_features(name);
    t.name = "host:" + name;
    t.cpu_name = name;
    set_instruction_set(t.cpu, [&](const char* f) { auto it = features.find(f); return it != features.end() && it->second; }, name);
  }
  std::map<std::string, int64_t*> caches{{"l1", &t.cpu.l1_bytes}, {"l2", &t.cpu.l2_bytes}, {"l3", &t.cpu.l3_bytes}};
  std::set<std::string> given;
  for (size_t at = comma; at != std::string::npos;) {
    const size_t next = spec.find(',', at + 1);
    const std::string item = spec.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    at = next;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const auto cache = caches.find(key);
    if (eq == std::string::npos || cache == caches.end())
      user_error("CPU '", spec, "': '", item, "' is not a cache size (l1=SIZE, l2=SIZE or l3=SIZE after the CPU's name, e.g. znver3,l2=512K)");
    if (!given.insert(key).second) user_error("CPU '", spec, "': ", key, " is given twice");
    const std::optional<int64_t> bytes = cache_size(item.substr(eq + 1));
    if (!bytes)
      user_error("CPU '", spec, "': ", key, "=", item.substr(eq + 1), " is not a cache size (bytes, or KiB, MiB or GiB with K, M or G: 48K, 1M; from 1K to 1024G)");
    *cache->second = *bytes;
  }
  // Only sizes given are checked: this machine's own, as its kernel reports them, are taken as they are.
  if (!given.empty() && (t.cpu.l1_bytes > t.cpu.l2_bytes || t.cpu.l2_bytes > t.cpu.l3_bytes))
    user_error("CPU '", spec, "': the caches must grow from level to level, but l1 is ", t.cpu.l1_bytes, ", l2 ", t.cpu.l2_bytes,
               " and l3 ", t.cpu.l3_bytes, " bytes");
  return t;
}

std::optional<std::string> cpu_of_target(const std::string& spec) {
  if (spec == "cpu") return std::string();
  if (spec.rfind("cpu:", 0) == 0) return spec.substr(4);
  return std::nullopt;
}

}  // namespace polytile::cpu
