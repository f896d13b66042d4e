// The PTX code generator (polytile/ptx.h): lowering for a GPU target, one LLVM module of kernels,
// libdevice, NVPTX, and the kernel bundle; and ptxas, run as a program of the CUDA toolkit.
#include "polytile/ptx.h"

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/IPO/Internalize.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>

#include "polytile/error.h"
#include "polytile/llvm_ir.h"
#include "polytile/lower.h"

#ifndef POLYTILE_CUDA_PATH
#define POLYTILE_CUDA_PATH "/usr/local/cuda"
#endif

namespace polytile::ptx {

namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";

void initialize_nvptx() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

std::unique_ptr<llvm::TargetMachine> target_machine(const std::string& arch) {
  initialize_nvptx();
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, error);
  if (!target) throw InternalError("LLVM has no NVPTX target: " + error);
  llvm::TargetOptions options;
  options.AllowFPOpFusion = llvm::FPOpFusion::Strict;  // every operation rounds as the interpreter's
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(kTriple, arch, "", options, llvm::Reloc::Static,
                                                                      std::nullopt, llvm::CodeGenOpt::Aggressive));
  if (!tm) throw InternalError("LLVM cannot make an NVPTX target machine for " + arch);
  return tm;
}

std::vector<std::string> candidate_dirs(const char* sub) {
  std::vector<std::string> dirs;
  if (const char* cuda = std::getenv("CUDA_PATH"); cuda && *cuda) dirs.push_back(std::string(cuda) + sub);
  dirs.push_back(std::string(POLYTILE_CUDA_PATH) + sub);
  if (std::string(POLYTILE_CUDA_PATH) != "/usr/local/cuda") dirs.push_back(std::string("/usr/local/cuda") + sub);
  return dirs;
}

// The kernel of nest k: its index, then the nest's name with '.' as '_' ("k3_DI_update").
std::string kernel_name(size_t k, const sched::Nest& nest) {
  std::string name = "k" + std::to_string(k) + "_";
  for (char c : nest.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

// Optimizes for the device: O3 with the NVPTX machine's own passes (nvvm-reflect among them).
void optimize(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::PipelineTuningOptions pto;
  pto.LoopUnrolling = true;
  llvm::PassBuilder pb(&tm, pto);
  tm.registerPassBuilderCallbacks(pb);
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

// Links libdevice's functions that `m` calls (only those), then makes everything but the kernels internal
// so that what no kernel reaches is dropped. UserError when math is called and no libdevice is found.
void link_libdevice(llvm::Module& m, const Options& options, const std::set<std::string>& kernels) {
  std::vector<std::string> needed;
  for (const llvm::Function& f : m)
    if (f.isDeclaration() && f.getName().startswith("__nv_")) needed.push_back(f.getName().str());
  if (!needed.empty()) {
    std::vector<std::string> looked;
    std::optional<std::string> path = find_libdevice(options.libdevice, &looked);
    if (!path) {
      std::string where;
      for (const auto& l : looked) where += (where.empty() ? "" : ", ") + l;
      user_error("the program calls ", needed.front().substr(5), " and the GPU's math comes from the CUDA toolkit's ",
                 "libdevice.10.bc, which is not at ", where, " (set CUDA_PATH or POLYTILE_LIBDEVICE)");
    }
    llvm::SMDiagnostic diagnostic;
    std::unique_ptr<llvm::Module> lib = llvm::parseIRFile(*path, diagnostic, m.getContext());
    if (!lib) user_error("cannot read libdevice ", *path, ": ", diagnostic.getMessage().str());
    lib->setTargetTriple(m.getTargetTriple());
    lib->setDataLayout(m.getDataLayout());
    if (llvm::Linker::linkModules(m, std::move(lib), llvm::Linker::Flags::LinkOnlyNeeded))
      throw InternalError("LLVM could not link libdevice " + *path);
  }
  llvm::internalizeModule(m, [&](const llvm::GlobalValue& gv) { return kernels.count(gv.getName().str()) != 0; });
  // IEEE: no flush to zero, precise division and square root (libdevice asks through nvvm-reflect).
  m.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", uint32_t{0});
}

// The decimal number just before `label` in `line` ("Used 32 registers" -> 32 for " registers").
std::optional<int64_t> number_before(const std::string& line, const std::string& label) {
  const size_t at = line.find(label);
  if (at == std::string::npos) return std::nullopt;
  size_t from = at;
  while (from > 0 && std::isdigit(static_cast<unsigned char>(line[from - 1]))) --from;
  if (from == at) return std::nullopt;
  return std::stoll(line.substr(from, at - from));
}

std::string emit_ptx(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::SmallString<0> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CGFT_AssemblyFile))
    throw InternalError("LLVM's NVPTX back end cannot emit PTX");
  pm.run(m);
  return std::string(text.str());
}

}  // namespace

Tuned tune(const Program& program, const std::map<std::string, TensorType>& inputs, const Options& options,
           const std::function<double(const Compiled&)>& measure,
           const std::function<void(const std::string& candidate, double ms)>& progress) {
  Tuned out;
  size_t best = 0;
  for (const auto& [description, model] : sched::gpu_tuning_candidates(options.model.value_or(sched::GpuModel{}))) {
    Options o = options;
    o.model = model;
    Compiled c = compile(program, inputs, o);
    const double ms = measure(c);
    if (progress) progress(description, ms);
    out.candidates.emplace_back(description, ms);
    if (out.candidates.size() == 1 || ms < out.candidates[best].second) {
      best = out.candidates.size() - 1;
      out.best = std::move(c);
    }
  }
  std::rotate(out.candidates.begin(), out.candidates.begin() + static_cast<long>(best), out.candidates.begin() + static_cast<long>(best) + 1);
  return out;
}

std::optional<std::string> find_libdevice(const std::string& configured, std::vector<std::string>* looked) {
  std::vector<std::string> candidates;
  if (!configured.empty()) {
    candidates.push_back(configured);
  } else {
    if (const char* env = std::getenv("POLYTILE_LIBDEVICE"); env && *env) candidates.push_back(env);
    for (const auto& d : candidate_dirs("/nvvm/libdevice")) candidates.push_back(d + "/libdevice.10.bc");
  }
  for (const auto& c : candidates) {
    if (looked) looked->push_back(c);
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return std::nullopt;
}

std::optional<std::string> find_ptxas() {
  std::vector<std::string> candidates;
  for (const auto& d : candidate_dirs("/bin")) candidates.push_back(d + "/ptxas");
  if (const char* path = std::getenv("PATH")) {
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty()) candidates.push_back(dir + "/ptxas");
  }
  for (const auto& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return c;
  return std::nullopt;
}

namespace {

// One kernel's module: emitted, linked with libdevice, optimized, printed as IR and as PTX. Its internal
// functions and globals (what it kept of libdevice) take the kernel's name, so that the kernels' PTX
// texts join into one module.
struct KernelCode {
  std::string ir, ptx;
  std::optional<KernelResources> resources;  // ptxas's report, where it assembled the kernel
};

// sched::GpuModel::fit_registers: assembles the kernel `name` (the only one of `ptx`) and, where it spills
// at ptxas's own register choice, asks for as many blocks of `threads` per multiprocessor as its registers
// allowed (`.minnctapersm`: a register ceiling ptxas fills), then one fewer, down to one, until it spills
// nothing; `ptx` is the last one tried. ptxas's report of that PTX.
KernelResources fit_registers(std::string& ptx, const std::string& name, int64_t threads, const std::string& arch) {
  auto report = [&](const std::string& text) {
    Assembled a = assemble(text, arch);
    POLYTILE_CHECK(a.kernels.size() == 1 && a.kernels[0].name == name, "ptxas reported ", a.kernels.size(), " kernels for ", name);
    return a.kernels[0];
  };
  KernelResources r = report(ptx);
  if (r.spill_stores == 0 && r.spill_loads == 0) return r;
  // The launch bounds LLVM printed for the kernel (its block's threads); the ceiling goes after them.
  const size_t entry = ptx.find(".entry " + name + "(");
  const size_t bounds = entry == std::string::npos ? entry : ptx.find("\n.maxntid ", entry);
  POLYTILE_CHECK(bounds != std::string::npos, "the PTX of ", name, " has no .maxntid");
  const size_t line_end = ptx.find('\n', bounds + 1);
  // Every sm_75+ multiprocessor has 64K registers, allocated to a warp 256 at a time (8 per thread).
  const int64_t per_thread = (r.registers + 7) / 8 * 8;
  const int fitted = static_cast<int>(std::max<int64_t>(1, 65536 / (per_thread * threads)));
  std::string tried;
  for (int blocks = fitted; blocks >= 1; --blocks) {
    tried = ptx.substr(0, line_end) + "\n.minnctapersm " + std::to_string(blocks) + ptx.substr(line_end);
    r = report(tried);
    r.min_blocks_per_sm = blocks;
    if (r.spill_stores == 0 && r.spill_loads == 0) break;
  }
  ptx = std::move(tried);
  return r;
}

KernelCode compile_kernel(const sched::Nest& nest, const std::string& name, const ProgramTypes& types, const Options& options,
                          bool fit) {
  std::unique_ptr<llvm::TargetMachine> tm = target_machine(options.arch);
  llvm::LLVMContext context;
  llvm::Module module(name, context);
  module.setTargetTriple(kTriple);
  module.setDataLayout(tm->createDataLayout());
  llvm_ir::emit_kernel(module, nest, name, types);
  link_libdevice(module, options, {name});
  optimize(module, *tm);
  for (llvm::GlobalValue& gv : module.global_values())
    if (gv.hasLocalLinkage() && !gv.getName().startswith(name)) gv.setName(name + "_" + gv.getName().str());
  KernelCode out;
  llvm::raw_string_ostream ir(out.ir);
  module.print(ir, nullptr);
  out.ptx = emit_ptx(module, *tm);
  if (fit) {
    const auto& b = nest.kernel->block;
    out.resources = fit_registers(out.ptx, name, b[0] * b[1] * b[2], options.arch);
  }
  return out;
}

// The PTX of kernels compiled apart, as one module: the first text whole, the others without their
// header (comments, .version, .target, .address_size), which they share.
std::string join_ptx(const std::vector<KernelCode>& kernels) {
  std::string out;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const std::string& ptx = kernels[k].ptx;
    if (k == 0) {
      out = ptx;
      continue;
    }
    const std::string header_end = ".address_size 64\n";
    const size_t at = ptx.find(header_end);
    if (at == std::string::npos) throw InternalError("the PTX of kernel " + std::to_string(k) + " has no .address_size header");
    out += ptx.substr(at + header_end.size());
  }
  return out;
}

}  // namespace

Compiled compile(const Program& program, const std::map<std::string, TensorType>& inputs, const Options& options) {
  auto t0 = std::chrono::steady_clock::now();
  sched::LowerOptions lower_options;
  lower_options.target = sched::gpu_target(options.arch);
  if (options.model) lower_options.target.gpu = *options.model;
  lower_options.reduce_and_defract = options.reduce_and_defract;
  lower_options.verify = options.verify;
  // Each kernel compiles on a thread of its own as soon as its nest is final, while the scheduler goes on
  // with the next nests (a weight gradient's partial sums compile while their sum is scheduled), and is
  // assembled there where registers are fitted.
  const bool fit = lower_options.target.gpu->fit_registers && find_ptxas().has_value();
  ProgramTypes types;
  std::vector<std::future<KernelCode>> pending;
  sched::LowerObserver observer;
  observer.program = [&types](const Program&, const ProgramTypes& t) { types = t; };
  observer.nest = [&](size_t k, const sched::Nest& nest) {
    pending.push_back(std::async(std::launch::async, [&types, &options, fit, k, nest] {
      return compile_kernel(nest, kernel_name(k, nest), types, options, fit);
    }));
  };
  sched::Lowered lowered = sched::lower(program, inputs, lower_options, observer);
  Compiled out;
  out.program = std::move(lowered.program);
  out.types = std::move(lowered.types);
  out.schedule = std::move(lowered.schedule);

  // Buffers: every input, every output, and the scratch tensors kernels touch.
  cuda::KernelBundle& bundle = out.bundle;
  std::set<std::string> touched;
  for (const sched::Nest& nest : out.schedule.nests)
    for (const std::string& t : llvm_ir::nest_tensors(nest)) touched.insert(t);
  std::set<std::string> listed;
  for (const auto& in : out.program.inputs) {
    bundle.buffers.push_back({in.name, cuda::BundleBuffer::Role::input, out.types.tensors.at(in.name)});
    listed.insert(in.name);
  }
  for (const auto& o : out.program.outputs) {
    if (listed.count(o)) user_error("output ", o, " is the program's input ", o, ": a kernel bundle returns computed tensors only");
    bundle.buffers.push_back({o, cuda::BundleBuffer::Role::output, out.types.tensors.at(o)});
    listed.insert(o);
  }
  for (const auto& st : out.program.statements) {
    const std::string& t = statement_output(st);
    if (!listed.count(t) && touched.count(t)) {
      bundle.buffers.push_back({t, cuda::BundleBuffer::Role::scratch, out.types.tensors.at(t)});
      listed.insert(t);
    }
  }

  bundle.target = options.arch;
  POLYTILE_CHECK(pending.size() == out.schedule.nests.size(), "compiled ", pending.size(), " kernels of ", out.schedule.nests.size(), " nests");
  std::vector<KernelCode> code;
  for (size_t k = 0; k < out.schedule.nests.size(); ++k) {
    const sched::Nest& nest = out.schedule.nests[k];
    cuda::BundleKernel kernel;
    kernel.name = kernel_name(k, nest);
    kernel.grid = nest.kernel->grid;
    kernel.block = nest.kernel->block;
    kernel.args = llvm_ir::nest_tensors(nest);
    bundle.kernels.push_back(std::move(kernel));
    code.push_back(pending[k].get());
    out.llvm_ir += code.back().ir;
    if (code.back().resources) out.resources.push_back(*code.back().resources);
  }
  bundle.ptx = join_ptx(code);

  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Assembled assemble(const std::string& ptx, const std::string& arch) {
  sched::gpu_target(arch);  // UserError for a bad arch
  std::optional<std::string> ptxas = find_ptxas();
  if (!ptxas) user_error("ptxas (CUDA toolkit) not found in $CUDA_PATH/bin, ", POLYTILE_CUDA_PATH, "/bin or PATH");
  char dir_template[] = "/tmp/polytile-ptxas-XXXXXX";
  if (!::mkdtemp(dir_template)) user_error("cannot make a temporary directory for ptxas");
  const std::filesystem::path dir(dir_template);
  struct Cleanup {
    std::filesystem::path dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  {
    std::ofstream f(dir / "kernels.ptx", std::ios::binary);
    f << ptx;
    if (!f) user_error("cannot write ", (dir / "kernels.ptx").string());
  }
  const std::string command = "'" + *ptxas + "' -v -arch=" + arch + " -o '" + (dir / "kernels.cubin").string() + "' '" +
                              (dir / "kernels.ptx").string() + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) user_error("cannot run ", *ptxas);
  Assembled out;
  out.arch = arch;
  std::array<char, 4096> chunk;
  size_t n;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0) out.log.append(chunk.data(), n);
  const int status = ::pclose(pipe);
  if (status != 0) user_error("ptxas rejected the PTX for ", arch, ":\n", out.log);
  // ptxas -v: "Compiling entry function 'k0' for 'sm_90'", then "N bytes stack frame, N bytes spill stores,
  // N bytes spill loads" and "Used N registers, ... N bytes smem".
  std::istringstream lines(out.log);
  for (std::string line; std::getline(lines, line);) {
    const std::string entry = "Compiling entry function '";
    if (size_t at = line.find(entry); at != std::string::npos) {
      const size_t from = at + entry.size();
      out.kernels.push_back({line.substr(from, line.find('\'', from) - from)});
      continue;
    }
    if (out.kernels.empty()) continue;
    KernelResources& k = out.kernels.back();
    if (auto v = number_before(line, " bytes stack frame")) k.stack_bytes = *v;
    if (auto v = number_before(line, " bytes spill stores")) k.spill_stores = *v;
    if (auto v = number_before(line, " bytes spill loads")) k.spill_loads = *v;
    if (auto v = number_before(line, " registers")) k.registers = static_cast<int>(*v);
    if (auto v = number_before(line, " bytes smem")) k.shared_bytes = *v;
  }
  return out;
}

}  // namespace polytile::ptx
