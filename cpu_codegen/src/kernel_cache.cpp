// The persistent kernel cache (kernel_cache.h): entries are exported objects in files of their own,
// loaded with ORC; LoadedProgram runs them with TBB behind the entry point's parallel_for.
#include "polytile/kernel_cache.h"

#include <isl/version.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/Support/MemoryBuffer.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler_fingerprint.h"
#include "internal.h"
#include "polytile/interpreter.h"

namespace polytile::cpu {

namespace fs = std::filesystem;

// ---- loading and running an exported object ----

using ParallelTask = void (*)(void*, int64_t, int64_t);
using ParallelFor = void (*)(void*, int64_t, int64_t, ParallelTask, void*);
using EntryFn = int (*)(void* const*, void*, ParallelFor, void*);

struct LoadedProgram::Impl {
  ExportedObject exported;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  EntryFn entry = nullptr;
  int threads = 1;                               // the machine's, for run(inputs, 0)
  ReusePool<std::unique_ptr<char[]>> workspaces;  // of finished runs
  // One TBB arena per thread count, kept between runs: a run in a new arena started with the calling
  // thread alone while TBB's workers joined it (a 16 MB elementwise copy on 2 threads took 2 ms in a new
  // arena per run, against 1 ms in CompiledProgram::run).
  std::mutex arenas_mutex;
  std::map<int, std::unique_ptr<tbb::task_arena>> arenas;
  tbb::task_arena& arena(int threads) {
    std::lock_guard<std::mutex> lock(arenas_mutex);
    std::unique_ptr<tbb::task_arena>& a = arenas[threads];
    if (!a) a = std::make_unique<tbb::task_arena>(threads);
    return *a;
  }
};

LoadedProgram::LoadedProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedProgram::~LoadedProgram() = default;
const ExportedObject& LoadedProgram::exported() const { return impl_->exported; }

std::shared_ptr<const LoadedProgram> load(ExportedObject exported) {
  auto impl = std::make_unique<LoadedProgram::Impl>();
  impl->jit = make_jit();
  check(impl->jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(exported.object, exported.entry + ".o")),
        "loading the object of " + exported.entry);
  impl->entry = check(impl->jit->lookup(exported.entry + "_argv"), "looking up " + exported.entry + "_argv").toPtr<EntryFn>();
  impl->exported = std::move(exported);
  impl->threads = host_target().threads;
  return std::make_shared<const LoadedProgram>(std::move(impl));
}

namespace {

// The entry point's parallel_for: TBB in the caller's arena.
void tbb_parallel_for(void*, int64_t begin, int64_t end, ParallelTask task, void* closure) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(begin, end),
                    [&](const tbb::blocked_range<int64_t>& r) { task(closure, r.begin(), r.end()); });
}

}  // namespace

TensorMap LoadedProgram::run(const TensorMap& inputs, int threads) const {
  TensorMap outputs;
  run(inputs, outputs, threads);
  return outputs;
}

void LoadedProgram::run(const TensorMap& inputs, TensorMap& outputs, int threads) const {
  check_threads(threads);
  const ExportedObject& e = impl_->exported;
  std::vector<void*> arguments;
  TensorMap made;  // outputs allocated by this run, moved into `outputs` once it is done
  for (const auto& a : e.arguments) {
    if (!a.output) {
      arguments.push_back(const_cast<void*>(compiled_input(inputs, a.tensor, a.type).data()));  // read only
      continue;
    }
    if (Buffer* reuse = reusable_output(outputs, a.tensor, a.type)) {
      arguments.push_back(reuse->data());
      continue;
    }
    Buffer& out = made[a.tensor] = Buffer(a.type.dtype, a.type.shape);
    arguments.push_back(out.data());  // the buffer's memory stays where it is when it moves
  }
  std::unique_ptr<char[]> workspace = impl_->workspaces.take();
  if (!workspace && e.workspace_bytes > 0) workspace.reset(new char[static_cast<size_t>(e.workspace_bytes)]);
  int status = 0;
  tbb::task_arena& arena = impl_->arena(threads > 0 ? threads : impl_->threads);
  arena.execute([&] { status = impl_->entry(arguments.data(), workspace.get(), tbb_parallel_for, nullptr); });
  if (workspace) impl_->workspaces.give(std::move(workspace));
  if (status != 0) throw InternalError(e.entry + " returned " + std::to_string(status) + " with a workspace given");
  for (auto& [name, buffer] : made) outputs[name] = std::move(buffer);
}

// ---- the cache's files ----

namespace {

const char* const kMagic = "polytile kernel cache entry 1\n";
const char* const kSuffix = ".entry";

uint64_t fnv1a(const std::string& s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ULL;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string dims(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

std::string serialize(const std::string& key, const ExportedObject& e) {
  std::ostringstream o;
  o << kMagic << "key " << key.size() << "\n" << key << "\n"
    << "entry " << e.entry << "\ncpu " << e.cpu << "\nworkspace " << e.workspace_bytes << "\n";
  for (const auto& a : e.arguments)
    o << "argument " << a.tensor << " " << a.parameter << " " << (a.output ? "output" : "input") << " "
      << to_string(a.type.dtype) << " " << dims(a.type.shape) << "\n";
  o << "object " << e.object.size() << "\n" << e.object << "\n";
  std::string s = o.str();
  return s + "checksum " + hex(fnv1a(s, s.size())) + "\n";
}

// Reads an entry back; on anything wrong, says what in `why` and returns nothing.
std::optional<ExportedObject> deserialize(const std::string& text, const std::string& key, std::string& why) {
  const std::string tail = "checksum ";
  const size_t checksum_line = tail.size() + 16 + 1;  // "checksum " 16 hex digits '\n'
  if (text.size() < std::string(kMagic).size() + checksum_line || text.compare(0, std::string(kMagic).size(), kMagic) != 0) {
    why = "not a kernel cache entry of this version";
    return std::nullopt;
  }
  const size_t body = text.size() - checksum_line;
  if (text.compare(body, tail.size(), tail) != 0 || text.back() != '\n') {
    why = "truncated";
    return std::nullopt;
  }
  if (text.substr(body + tail.size(), 16) != hex(fnv1a(text, body))) {
    why = "corrupted (checksum mismatch)";
    return std::nullopt;
  }
  size_t pos = std::string(kMagic).size();
  auto line = [&]() {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos || end > body) throw std::runtime_error("malformed");
    std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    return l;
  };
  auto blob = [&](const std::string& field) {
    std::istringstream l(line());
    std::string name;
    size_t n = 0;
    if (!(l >> name >> n) || name != field || pos + n + 1 > body || text[pos + n] != '\n') throw std::runtime_error("malformed");
    std::string b = text.substr(pos, n);
    pos += n + 1;
    return b;
  };
  auto field = [&](const std::string& name) {
    std::string l = line();
    if (l.compare(0, name.size() + 1, name + " ") != 0) throw std::runtime_error("malformed");
    return l.substr(name.size() + 1);
  };
  try {
    if (blob("key") != key) {
      why = "written for another program (a hash collision or a renamed file)";
      return std::nullopt;
    }
    ExportedObject e;
    e.entry = field("entry");
    e.cpu = field("cpu");
    e.workspace_bytes = std::stoll(field("workspace"));
    while (text.compare(pos, 9, "argument ") == 0) {
      std::istringstream l(field("argument"));
      ExportedObject::Argument a;
      std::string role, dtype, shape;
      if (!(l >> a.tensor >> a.parameter >> role >> dtype >> shape) || (role != "input" && role != "output"))
        throw std::runtime_error("malformed");
      a.output = role == "output";
      auto t = parse_dtype(dtype);
      if (!t) throw std::runtime_error("malformed");
      a.type.dtype = *t;
      if (shape != "-") {
        std::istringstream d(shape);
        for (std::string n; std::getline(d, n, 'x');) a.type.shape.push_back(std::stoll(n));
      }
      e.arguments.push_back(std::move(a));
    }
    e.object = blob("object");
    if (pos != body) throw std::runtime_error("malformed");
    return e;
  } catch (const std::exception&) {
    why = "malformed";
    return std::nullopt;
  }
}

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

// Writes `bytes` to a temporary file and renames it to `path` (atomic: readers see the old entry, none or
// this one). A cache that cannot be written is no error: `why` says what failed.
void KernelCache::store(const fs::path& path, const std::string& bytes, std::string& why) const {
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) {
    why = "cannot create " + directory_ + ": " + ec.message();
    return;
  }
  static std::atomic<uint64_t> counter{0};
  const fs::path temp = fs::path(directory_) / (".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
                                                path.filename().string());
  {
    std::ofstream f(temp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) why = "cannot write " + temp.string();
  }
  if (why.empty()) {
    fs::rename(temp, path, ec);
    if (ec) why = "cannot rename " + temp.string() + " to " + path.string() + ": " + ec.message();
  }
  if (!why.empty()) fs::remove(temp, ec);
}

// Least recently used entries out while the cache is over its limit (never `keep`, the newest).
void KernelCache::trim(const fs::path& keep) const {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> entries;
  uint64_t total = 0;
  for (const auto& f : fs::directory_iterator(directory_, ec)) {
    if (f.path().extension() != kSuffix) continue;
    total += f.file_size(ec);
    if (f.path() != keep) entries.emplace_back(f.last_write_time(ec), f.path());
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& [time, old] : entries) {
    if (total <= limit_bytes_) break;
    const uint64_t size = fs::file_size(old, ec);
    if (fs::remove(old, ec)) total -= size;
  }
}

std::string KernelCache::default_directory() {
  if (const char* dir = std::getenv("POLYTILE_CACHE_DIR")) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/polytile";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/polytile";
  return "";
}

std::string compiler_identity() {
  std::string isl = isl_version();  // "isl-0.25-GMP\n"
  while (!isl.empty() && std::isspace(static_cast<unsigned char>(isl.back()))) isl.pop_back();
  return std::string("polytile ") + POLYTILE_VERSION + ", sources " + POLYTILE_COMPILER_SOURCES + ", LLVM " +
         LLVM_VERSION_STRING + ", " + isl;
}

KernelCache::KernelCache(std::string directory, uint64_t limit_bytes)
    : directory_(std::move(directory)), limit_bytes_(limit_bytes) {
  if (directory_.empty()) user_error("the kernel cache needs a directory (set POLYTILE_CACHE_DIR)");
}

KernelCache::Result KernelCache::get(const Program& program, const std::map<std::string, TensorType>& inputs,
                                     const CompileOptions& options) {
  if (options.tune) user_error("the kernel cache holds untuned programs: compile with tuning without it");
  if (options.target.gpu) user_error("the kernel cache holds programs for this CPU, not for ", options.target.name);
  auto t0 = std::chrono::steady_clock::now();
  check_threads(options.threads);
  check_runs_here(options.target);
  const llvm::orc::JITTargetMachineBuilder machine = host_machine(options.target.cpu_name);
  const std::string key = cache_key(program, inputs, options) + "|host " + machine.getCPU() + " " +
                          machine.getFeatures().getString() + "|" + compiler_identity();
  const std::string hash = hex(fnv1a(key, key.size()));
  const fs::path path = fs::path(directory_) / (hash + kSuffix);
  Result r;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::optional<ExportedObject> found = deserialize(read_file(path), key, r.dropped);
    if (found) {
      fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
      r.program = load(std::move(*found));
      r.hit = true;
      r.seconds = seconds_since(t0);
      return r;
    }
    fs::remove(path, ec);  // never loaded; compiled again below
  }
  // The entry point's name is the key's hash: no two cached programs in one process share a symbol.
  ExportedObject exported = export_object(program, inputs, "polytile_" + hash, options);
  store(path, serialize(key, exported), r.not_stored);
  trim(path);
  r.program = load(std::move(exported));
  r.seconds = seconds_since(t0);
  return r;
}

KernelCache::Info KernelCache::info() const {
  Info i;
  i.directory = directory_;
  i.limit_bytes = limit_bytes_;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(directory_, ec)) {
    if (f.path().extension() != kSuffix) continue;
    ++i.entries;
    i.bytes += f.file_size(ec);
  }
  return i;
}

size_t KernelCache::clear() {
  size_t removed = 0;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(directory_, ec))
    if (f.path().extension() == kSuffix || f.path().filename().string().rfind(".tmp-", 0) == 0) files.push_back(f.path());
  for (const auto& f : files)
    if (fs::remove(f, ec) && f.extension() == kSuffix) ++removed;
  return removed;
}

}  // namespace polytile::cpu
