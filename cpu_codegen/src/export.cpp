// Ahead-of-time export: the nests the JIT would run, linked into one module with a generated C entry point
// that does what the TBB runtime does for a JIT-compiled program (the buffer table, scratch tensors in one
// workspace, the nests in order, parallel outer loops handed to the caller's parallel_for), compiled to a
// position-independent object, and a C header that documents it.
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "internal.h"
#include "polytile/interpreter.h"

namespace polytile::cpu {

namespace {

// C11 and C++ keywords and the names the header itself uses: no entry point or parameter may be one.
const std::set<std::string>& reserved_names() {
  static const std::set<std::string> names = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
      "char16_t", "char32_t", "char8_t", "class", "co_await", "co_return", "co_yield", "compl", "concept", "const",
      "const_cast", "consteval", "constexpr", "constinit", "continue", "decltype", "default", "delete", "do", "double",
      "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
      "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or",
      "or_eq", "private", "protected", "public", "register", "reinterpret_cast", "requires", "restrict", "return",
      "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch", "template", "this",
      "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using",
      "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq", "_Alignas", "_Alignof", "_Atomic", "_Bool",
      "_Complex", "_Generic", "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local",
      // the header's own names
      "workspace", "parallel_for", "parallel_user", "polytile_task", "polytile_parallel_for", "int32_t", "int64_t",
      "uint8_t", "malloc", "free", "memcpy"};
  return names;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

const char* c_type(DType t) {
  switch (t) {
    case DType::f16: return "uint16_t";  // IEEE binary16 bits (documented in the header)
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::boolean: return "bool";
  }
  throw InternalError("export: unknown dtype");
}

using Argument = ExportedObject::Argument;

// The entry point's plan: its arguments and, for every slot of the buffer table, where the pointer comes
// from (an argument, an offset into the workspace, or nothing: no nest touches the tensor).
struct Plan {
  std::vector<Argument> arguments;  // inputs in program order, then outputs in program order
  std::vector<int> slot_argument;   // per slot: argument index, or -1
  std::vector<int64_t> slot_offset; // per slot without an argument: workspace offset, or -1
  int64_t workspace_bytes = 0;
  int64_t chunk_bytes = 0;  // the most a row group's task mallocs for its chunk tensors (0: none)
  std::vector<std::string> streamed;  // the parameters of outputs stored past the caches (sched::Nest::stream)
};

// The header's line naming the outputs stored past the caches ("" when none).
std::string streamed_line(const std::vector<std::string>& parameters) {
  if (parameters.empty()) return std::string();
  std::string names;
  for (const std::string& p : parameters) names += (names.empty() ? "" : ", ") + p;
  return " * " + names + ": stored past the caches (non-temporal stores) where 64-byte aligned, through them\n" +
         " *   otherwise (large outputs nothing in the program reads again).\n";
}

Plan plan(const CompiledProgram::Impl& impl, const Program& source) {
  Plan p;
  std::map<std::string, int> argument;
  for (const auto& in : source.inputs) {
    argument[in.name] = static_cast<int>(p.arguments.size());
    p.arguments.push_back({in.name, "", false, impl.inputs.at(in.name)});
  }
  std::set<std::string> seen;
  for (const std::string& out : impl.program.outputs) {
    if (!seen.insert(out).second) continue;
    const TensorType& t = impl.types.tensors.count(out) ? impl.types.tensors.at(out) : impl.inputs.at(out);
    if (!impl.inputs.count(out)) argument[out] = static_cast<int>(p.arguments.size());
    p.arguments.push_back({out, "", true, t});
  }
  std::set<std::string> taken;
  for (Argument& a : p.arguments) {
    a.parameter = a.output && impl.inputs.count(a.tensor) ? a.tensor + "_out" : a.tensor;
    while (reserved_names().count(a.parameter) || taken.count(a.parameter)) a.parameter += "_";
    taken.insert(a.parameter);
  }
  for (const std::string& name : impl.buffers) {
    auto a = argument.find(name);
    p.slot_argument.push_back(a == argument.end() ? -1 : a->second);
    int64_t offset = -1;
    if (a == argument.end() && impl.touched.count(name)) {
      offset = p.workspace_bytes;
      p.workspace_bytes += (impl.types.tensors.at(name).bytes() + 63) / 64 * 64;  // every tensor 64-byte aligned
    }
    p.slot_offset.push_back(offset);
  }
  for (const GroupChunks& g : impl.chunks) p.chunk_bytes = std::max(p.chunk_bytes, g.bytes);
  for (const Argument& a : p.arguments)
    if (a.output && std::any_of(impl.schedule.nests.begin(), impl.schedule.nests.end(),
                                [&](const sched::Nest& n) { return n.stream && n.tensor == a.tensor; }))
      p.streamed.push_back(a.parameter);
  return p;
}

// A row group's task, void NAME(ptr buffers, i64 lo, i64 hi): for each chunk of `rows` outer iterations
// in [lo, hi), every nest of the group on it (sched::NestGroup). With chunk tensors, the task mallocs a
// chunk's memory for them once and runs the nests on its own copy of the table, their slots pointed into
// that memory for each chunk (ChunkSlot); when malloc fails, on the caller's table, whose slots hold the
// tensors' full-size memory in the workspace -- slower, the same values.
llvm::Function* emit_group(llvm::Module& m, const std::string& name, const sched::NestGroup& group, const GroupChunks& chunks,
                           const std::vector<llvm::Function*>& nests, const CompiledProgram::Impl& impl) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Type* ptr = b.getPtrTy();
  auto* fn = llvm::Function::Create(nests[group.first]->getFunctionType(), llvm::Function::InternalLinkage, name, m);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  llvm::Value *table = fn->getArg(0), *lo = fn->getArg(1), *hi = fn->getArg(2);
  auto* start = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "chunk", fn);
  auto* body = llvm::BasicBlock::Create(ctx, "nests", fn);
  auto* done = llvm::BasicBlock::Create(ctx, "done", fn);
  b.SetInsertPoint(start);
  const std::vector<ChunkSlot>& slots = chunks.slots;
  llvm::Value *memory = nullptr, *own = nullptr, *used = table;
  if (!slots.empty()) {
    own = b.CreateAlloca(llvm::ArrayType::get(ptr, impl.buffers.size()), nullptr, "chunk_buffers");
    b.CreateMemCpy(own, llvm::MaybeAlign(8), table, llvm::MaybeAlign(8), impl.buffers.size() * 8);
    llvm::FunctionCallee malloc_fn = m.getOrInsertFunction("malloc", llvm::FunctionType::get(ptr, {i64}, false));
    memory = b.CreateCall(malloc_fn, {b.getInt64(chunks.bytes)}, "chunk_memory");
    used = b.CreateSelect(b.CreateIsNull(memory), table, own, "table");
  }
  b.CreateBr(loop);
  b.SetInsertPoint(loop);
  llvm::PHINode* c = b.CreatePHI(i64, 2, "c");
  c->addIncoming(lo, start);
  b.CreateCondBr(b.CreateICmpSLT(c, hi), body, done);
  b.SetInsertPoint(body);
  llvm::Value* next = b.CreateAdd(c, llvm::ConstantInt::get(i64, group.rows), "next");
  llvm::Value* end = b.CreateSelect(b.CreateICmpSLT(next, hi), next, hi, "end");
  // Each slot at memory + offset - (c - outer_lo) x row_bytes: a plain (not inbounds) GEP, pointer
  // arithmetic that may leave the memory; the nests' addresses from it land inside. Stored in the task's
  // own table whether or not malloc gave memory (without, the nests run on the caller's).
  llvm::Value* row = b.CreateSub(c, b.getInt64(impl.schedule.nests[group.first].outer_lo));
  for (const ChunkSlot& s : slots) {
    llvm::Value* at = b.CreateGEP(b.getInt8Ty(), memory, b.CreateSub(b.getInt64(s.offset), b.CreateMul(row, b.getInt64(s.row_bytes))));
    b.CreateStore(at, b.CreateConstGEP1_64(ptr, own, s.slot));
  }
  for (size_t j = group.first; j <= group.last; ++j) b.CreateCall(nests[j], {used, c, end});
  c->addIncoming(next, body);
  b.CreateBr(loop);
  b.SetInsertPoint(done);
  if (memory) b.CreateCall(m.getOrInsertFunction("free", llvm::FunctionType::get(b.getVoidTy(), {ptr}, false)), {memory});
  b.CreateRetVoid();
  return fn;
}

// The entry point: int ENTRY(ptr args..., ptr workspace, ptr parallel_for, ptr user).
void emit_entry(llvm::Module& m, const std::string& entry, const CompiledProgram::Impl& impl, const Plan& plan,
                const std::vector<llvm::Function*>& nests) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Type* ptr = b.getPtrTy();
  llvm::Type* i64 = b.getInt64Ty();
  std::vector<llvm::Type*> params(plan.arguments.size() + 3, ptr);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getInt32Ty(), params, false), llvm::Function::ExternalLinkage,
                                    entry, m);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  for (size_t a = 0; a < plan.arguments.size(); ++a) fn->getArg(static_cast<unsigned>(a))->setName(plan.arguments[a].parameter);
  llvm::Value* workspace = fn->getArg(static_cast<unsigned>(plan.arguments.size()));
  llvm::Value* parallel_for = fn->getArg(static_cast<unsigned>(plan.arguments.size() + 1));
  llvm::Value* user = fn->getArg(static_cast<unsigned>(plan.arguments.size() + 2));
  workspace->setName("workspace");
  parallel_for->setName("parallel_for");
  user->setName("parallel_user");

  auto* start = llvm::BasicBlock::Create(ctx, "entry", fn);
  b.SetInsertPoint(start);
  auto* table = b.CreateAlloca(llvm::ArrayType::get(ptr, impl.buffers.size()), nullptr, "buffers");
  llvm::Value* owned = llvm::ConstantPointerNull::get(llvm::PointerType::get(ctx, 0));  // what this call mallocs
  if (plan.workspace_bytes > 0) {
    // No workspace from the caller: malloc one, and say so (1) when there is no memory.
    auto* alloc = llvm::BasicBlock::Create(ctx, "allocate", fn);
    auto* fail = llvm::BasicBlock::Create(ctx, "no_memory", fn);
    auto* have = llvm::BasicBlock::Create(ctx, "run", fn);
    b.CreateCondBr(b.CreateIsNull(workspace), alloc, have);
    b.SetInsertPoint(alloc);
    llvm::FunctionCallee malloc_fn = m.getOrInsertFunction("malloc", llvm::FunctionType::get(ptr, {i64}, false));
    llvm::Value* mem = b.CreateCall(malloc_fn, {b.getInt64(plan.workspace_bytes)}, "workspace_owned");
    b.CreateCondBr(b.CreateIsNull(mem), fail, have);
    b.SetInsertPoint(fail);
    b.CreateRet(b.getInt32(1));
    b.SetInsertPoint(have);
    auto* ws = b.CreatePHI(ptr, 2, "workspace_used");
    ws->addIncoming(workspace, start);
    ws->addIncoming(mem, alloc);
    auto* mine = b.CreatePHI(ptr, 2, "workspace_to_free");
    mine->addIncoming(owned, start);
    mine->addIncoming(mem, alloc);
    workspace = ws;
    owned = mine;
  }
  for (size_t s = 0; s < impl.buffers.size(); ++s) {
    llvm::Value* value = llvm::ConstantPointerNull::get(llvm::PointerType::get(ctx, 0));
    if (plan.slot_argument[s] >= 0) value = fn->getArg(static_cast<unsigned>(plan.slot_argument[s]));
    else if (plan.slot_offset[s] >= 0) value = b.CreateGEP(b.getInt8Ty(), workspace, b.getInt64(plan.slot_offset[s]));
    b.CreateStore(value, b.CreateConstGEP2_64(table->getAllocatedType(), table, 0, s));
  }
  // The nests in order; a parallel outer loop's [lo, hi] goes to the caller's parallel_for, when it gave one
  // (a row group's, to the function that runs the group's nests chunk by chunk).
  auto* task_type = llvm::FunctionType::get(b.getVoidTy(), {ptr, i64, i64, ptr, ptr}, false);
  auto group = impl.schedule.groups.begin();
  for (size_t k = 0; k < nests.size(); ++k) {
    const sched::Nest& nest = impl.schedule.nests[k];
    llvm::Value* whole[] = {table, b.getInt64(INT64_MIN), b.getInt64(INT64_MAX)};
    llvm::Function* task = nests[k];
    if (group != impl.schedule.groups.end() && group->first == k) {
      const GroupChunks& chunks = impl.chunks[static_cast<size_t>(group - impl.schedule.groups.begin())];
      const sched::NestGroup& g = *group++;
      task = emit_group(m, "group_" + std::to_string(k), g, chunks, nests, impl);
      k = g.last;
      whole[1] = b.getInt64(nest.outer_lo);
      whole[2] = b.getInt64(nest.outer_hi + 1);
    } else if (!splits_outer_loop(nest)) {
      b.CreateCall(task, whole);
      continue;
    }
    auto* split = llvm::BasicBlock::Create(ctx, "nest_" + std::to_string(k) + "_parallel", fn);
    auto* serial = llvm::BasicBlock::Create(ctx, "nest_" + std::to_string(k) + "_serial", fn);
    auto* next = llvm::BasicBlock::Create(ctx, "nest_" + std::to_string(k) + "_done", fn);
    b.CreateCondBr(b.CreateIsNull(parallel_for), serial, split);
    b.SetInsertPoint(split);
    b.CreateCall(task_type, parallel_for, {user, b.getInt64(nest.outer_lo), b.getInt64(nest.outer_hi + 1), task, table});
    b.CreateBr(next);
    b.SetInsertPoint(serial);
    b.CreateCall(task, whole);
    b.CreateBr(next);
    b.SetInsertPoint(next);
  }
  // An output that is an input of the program is copied.
  for (const Argument& a : plan.arguments) {
    if (!a.output || !impl.inputs.count(a.tensor) || a.type.bytes() == 0) continue;
    auto in = std::find_if(plan.arguments.begin(), plan.arguments.end(),
                           [&](const Argument& x) { return !x.output && x.tensor == a.tensor; });
    auto out = &a - plan.arguments.data();
    b.CreateMemCpy(fn->getArg(static_cast<unsigned>(out)), llvm::MaybeAlign(1),
                   fn->getArg(static_cast<unsigned>(in - plan.arguments.begin())), llvm::MaybeAlign(1), a.type.bytes());
  }
  if (plan.workspace_bytes > 0) {
    llvm::FunctionCallee free_fn = m.getOrInsertFunction("free", llvm::FunctionType::get(b.getVoidTy(), {ptr}, false));
    b.CreateCall(free_fn, {owned});
  }
  b.CreateRet(b.getInt32(0));
  // ENTRY_argv(ptr arguments, ptr workspace, ptr parallel_for, ptr user): the same, the tensors in an array.
  auto* argv_fn = llvm::Function::Create(
      llvm::FunctionType::get(b.getInt32Ty(), {ptr, ptr, ptr, ptr}, false), llvm::Function::ExternalLinkage, entry + "_argv", m);
  argv_fn->addFnAttr(llvm::Attribute::NoUnwind);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", argv_fn));
  std::vector<llvm::Value*> args;
  for (size_t a = 0; a < plan.arguments.size(); ++a)
    args.push_back(b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, argv_fn->getArg(0), a), plan.arguments[a].parameter));
  for (unsigned a = 1; a < 4; ++a) args.push_back(argv_fn->getArg(a));
  b.CreateRet(b.CreateCall(fn, args));
  std::string problems;
  llvm::raw_string_ostream os(problems);
  for (llvm::Function* f : {fn, argv_fn})
    if (llvm::verifyFunction(*f, &os)) throw InternalError("export: the entry point " + f->getName().str() + " is malformed: " + os.str());
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string header_text(const std::string& entry, const Plan& plan, const Program& source, const std::string& triple,
                        const std::string& cpu) {
  std::ostringstream h;
  const std::string guard = "POLYTILE_EXPORT_" + upper(entry) + "_H";
  std::string prototype = "int " + entry + "(";
  for (const Argument& a : plan.arguments)
    prototype += std::string(a.output ? "" : "const ") + c_type(a.type.dtype) + "* " + a.parameter + ", ";
  prototype += "void* workspace, polytile_parallel_for parallel_for, void* parallel_user)";
  h << "/* " << entry << ".h: generated by polytile " << POLYTILE_VERSION << " (polytile compile --target cpu). Do not edit.\n"
    << " *\n"
    << " * " << prototype << ";\n"
    << " *\n"
    << " * Runs the program below on the caller's memory. Every tensor is contiguous, row-major (C order) and\n"
    << " * aligned to its element size; inputs are only read; outputs are written in full and must not overlap\n"
    << " * each other or an input.\n";
  size_t width = 0;
  for (const Argument& a : plan.arguments) width = std::max(width, a.parameter.size());
  for (const Argument& a : plan.arguments) {
    h << " *   " << a.parameter << std::string(width - a.parameter.size() + 2, ' ') << (a.output ? "output " : "input  ")
      << a.type.str();
    if (a.parameter != a.tensor) h << (a.output ? " (the input " + a.tensor + ", copied)" : " (tensor " + a.tensor + ")");
    h << "\n";
  }
  if (std::any_of(plan.arguments.begin(), plan.arguments.end(), [](const Argument& a) { return a.type.dtype == DType::f16; }))
    h << " * f16 elements are IEEE binary16 bits (uint16_t here; _Float16 where the compiler has one).\n";
  h << " * workspace: NULL (the call mallocs " << upper(entry) << "_WORKSPACE_BYTES of scratch and frees it), or that\n"
    << " *   many bytes of the caller's, aligned to 64 bytes, used by one call at a time.\n"
    << " * parallel_for: NULL runs everything on the calling thread. Otherwise, for each parallel loop the call\n"
    << " *   makes parallel_for(parallel_user, begin, end, task, closure), which must call task(closure, b, e)\n"
    << " *   for ranges [b, e) that partition [begin, end), on any threads, and return once they have all\n"
    << " *   returned (calling task(closure, begin, end) once is a valid serial implementation).\n"
    << (plan.chunk_bytes > 0
            ? " * Row groups run each task's chunks of rows in malloc'ed memory of up to " + std::to_string(plan.chunk_bytes) +
                  " bytes\n *   (freed before the task returns; where malloc fails, in the workspace instead).\n"
            : std::string())
    << streamed_line(plan.streamed)
    << " * Returns 0, or 1 when workspace was NULL and malloc failed (nothing was written).\n"
    << " * Concurrent calls need disjoint outputs and workspaces.\n"
    << " *\n"
    << " * Machine code for " << triple << ", CPU " << cpu << " (the compiling machine's unless another was\n"
    << " * named) and newer CPUs with its instruction set. Link with -lm; nothing else is needed at run time.\n"
    << " *\n"
    << " * The program:\n";
  std::istringstream text(print(source));
  for (std::string line; std::getline(text, line);) h << " *   " << line << "\n";
  h << " */\n"
    << "#ifndef " << guard << "\n#define " << guard << "\n\n"
    << "#include <stdbool.h>\n#include <stdint.h>\n\n"
    << "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
    << "#ifndef POLYTILE_PARALLEL_FOR_DEFINED\n#define POLYTILE_PARALLEL_FOR_DEFINED\n"
    << "typedef void (*polytile_task)(void* closure, int64_t begin, int64_t end);\n"
    << "typedef void (*polytile_parallel_for)(void* parallel_user, int64_t begin, int64_t end, polytile_task task,\n"
    << "                                      void* closure);\n"
    << "#endif\n\n"
    << "#define " << upper(entry) << "_WORKSPACE_BYTES " << plan.workspace_bytes << "\n\n"
    << prototype << ";\n"
    << "/* The same with the tensors' pointers in an array, in the order above. */\n"
    << "int " << entry << "_argv(void* const* arguments, void* workspace, polytile_parallel_for parallel_for, void* parallel_user);\n\n"
    << "#ifdef __cplusplus\n}\n#endif\n\n"
    << "#endif\n";
  return h.str();
}

}  // namespace

ExportedObject export_object(const Program& program, const std::map<std::string, TensorType>& inputs,
                             const std::string& entry, const CompileOptions& options) {
  if (!is_identifier(entry))
    user_error("export: the entry point's name '", entry, "' is not a C identifier (letters, digits and _, not starting with a digit)");
  if (reserved_names().count(entry)) user_error("export: the entry point's name '", entry, "' is reserved in C or C++");
  if (options.target.gpu)
    user_error("export: target ", options.target.name, " is a GPU: an object for this CPU needs the cpu target (a GPU "
               "target compiles to a kernel bundle)");
  CompiledProgram::Impl impl;  // lowering types the program first: its user errors come before any code
  std::vector<NestModule> nests = lower_and_emit(impl, program, inputs, options, false, false);
  const Plan p = plan(impl, program);

  auto t0 = std::chrono::steady_clock::now();
  // One module: every nest's optimized module, moved into one context through bitcode and linked.
  llvm::LLVMContext ctx;
  auto module = std::make_unique<llvm::Module>(entry, ctx);
  llvm::Linker linker(*module);
  for (const NestModule& m : nests) {  // each nest's module, then those of its separate blocks
    const std::string name = m.module->getModuleIdentifier();
    std::string bitcode;
    {
      llvm::raw_string_ostream os(bitcode);
      llvm::WriteBitcodeToFile(*m.module, os);
    }
    auto copy = check(llvm::parseBitcodeFile(llvm::MemoryBufferRef(bitcode, name), ctx), "reading back " + name);
    if (linker.linkInModule(std::move(copy))) throw InternalError("export: LLVM could not link " + name);
  }
  std::vector<llvm::Function*> functions;
  for (size_t k = 0; k < impl.schedule.nests.size(); ++k) {
    llvm::Function* f = module->getFunction("nest_" + std::to_string(k));
    if (!f) throw InternalError("export: nest_" + std::to_string(k) + " is missing after linking");
    functions.push_back(f);
  }
  emit_entry(*module, entry, impl, p, functions);
  // Only the entry point is visible: two exported objects link into one program.
  for (llvm::Function& f : *module)
    if (!f.isDeclaration() && f.getName() != entry && f.getName() != entry + "_argv") {
      f.setName(entry + "_" + f.getName().str());
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
    }
  for (llvm::GlobalVariable& g : module->globals())
    if (!g.isDeclaration()) g.setLinkage(llvm::GlobalValue::InternalLinkage);

  llvm::orc::JITTargetMachineBuilder machine = host_machine(options.target.cpu_name);
  machine.setRelocationModel(llvm::Reloc::PIC_);
  auto tm = check(machine.createTargetMachine(), "creating the target machine");
  module->setDataLayout(tm->createDataLayout());
  module->setTargetTriple(tm->getTargetTriple().str());
  // The linked module's entry point asks for nothing: its machine code keeps Loop Strength Reduction.
  const std::unique_ptr<llvm::MemoryBuffer> object = machine_code(*module, *tm);
  ExportedObject out;
  out.entry = entry;
  out.object.assign(object->getBufferStart(), object->getBufferEnd());
  out.workspace_bytes = p.workspace_bytes;
  out.arguments = p.arguments;
  out.times = impl.times;
  out.times.optimize_and_jit += seconds_since(t0);
  out.cpu = tm->getTargetCPU().str();
  out.header = header_text(entry, p, program, tm->getTargetTriple().str(), out.cpu);
  return out;
}

void ExportedObject::write(const std::string& prefix) const {
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) user_error("cannot create the directory ", parent.string(), " for ", prefix, ".o: ", error.message());
  for (const auto& [path, bytes] : {std::pair{prefix + ".o", &object}, std::pair{prefix + ".h", &header}}) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) user_error("cannot write ", path);
    f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    if (!f) user_error("cannot write ", path);
  }
}

}  // namespace polytile::cpu
