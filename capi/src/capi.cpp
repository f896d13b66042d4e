// The C API (polytile/polytile.h) over the C++ libraries: every call catches what they throw and turns it
// into a status and this thread's last error.
#include "polytile/polytile.h"

#include <exception>
#include <memory>
#include <string>

#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/error.h"
#include "polytile/parser.h"

struct polytile_program {
  polytile::Program program;
  std::string text;
};

struct polytile_compiled {
  std::shared_ptr<const polytile::cpu::CompiledProgram> compiled;
  std::map<std::string, polytile::TensorType> outputs;
};

namespace {

using namespace polytile;

thread_local std::string last_error;

// Runs `body`, turning exceptions into a status and the last error.
template <typename F>
polytile_status guarded(F&& body) {
  try {
    body();
    last_error.clear();
    return POLYTILE_OK;
  } catch (const UserError& e) {
    last_error = e.what();
    return POLYTILE_USER_ERROR;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return POLYTILE_USER_ERROR;
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
    return POLYTILE_INTERNAL_ERROR;
  } catch (...) {
    last_error = "internal error: an unknown exception";
    return POLYTILE_INTERNAL_ERROR;
  }
}

template <typename T>
T* need(T* p, const char* what) {
  if (!p) user_error(what, " is NULL");
  return p;
}

DType dtype_of(int code, const std::string& tensor) {
  switch (code) {
    case POLYTILE_F32: return DType::f32;
    case POLYTILE_F64: return DType::f64;
    case POLYTILE_I32: return DType::i32;
    case POLYTILE_BOOL: return DType::boolean;
    case POLYTILE_I64: return DType::i64;
    case POLYTILE_F16: return DType::f16;
    default: user_error("tensor ", tensor, ": unknown dtype code ", code);
  }
}

polytile_dtype code_of(DType d) {
  switch (d) {
    case DType::f32: return POLYTILE_F32;
    case DType::f64: return POLYTILE_F64;
    case DType::i32: return POLYTILE_I32;
    case DType::boolean: return POLYTILE_BOOL;
    case DType::i64: return POLYTILE_I64;
    case DType::f16: return POLYTILE_F16;
  }
  return POLYTILE_F32;
}

std::string name_of(const polytile_tensor& t, size_t i) {
  if (!t.name) user_error("tensor ", i, " has no name");
  return t.name;
}

std::vector<int64_t> shape_of(const polytile_tensor& t, const std::string& name) {
  if (t.rank < 0 || t.rank > 64) user_error("tensor ", name, ": rank ", t.rank, " is not between 0 and 64");
  if (t.rank > 0 && !t.shape) user_error("tensor ", name, ": shape is NULL");
  return std::vector<int64_t>(t.shape, t.shape + t.rank);
}

ViewMap views(const polytile_tensor* tensors, size_t count, const char* what) {
  if (count && !tensors) user_error(what, " is NULL");
  ViewMap out;
  for (size_t i = 0; i < count; ++i) {
    std::string name = name_of(tensors[i], i);
    if (out.count(name)) user_error(what, ": tensor ", name, " is given twice");
    out[name] = TensorView{tensors[i].data, dtype_of(tensors[i].dtype, name), shape_of(tensors[i], name), {}};
  }
  return out;
}

std::map<std::string, TensorType> types_of(const polytile_tensor* tensors, size_t count, const char* what) {
  std::map<std::string, TensorType> types;
  for (const auto& [name, v] : views(tensors, count, what)) types[name] = {v.dtype, v.shape};
  return types;
}

std::unique_ptr<polytile_program> wrap(Program p) {
  auto out = std::make_unique<polytile_program>();
  out->text = print(p);
  out->program = std::move(p);
  return out;
}

}  // namespace

extern "C" {

const char* polytile_version(void) { return POLYTILE_VERSION; }

const char* polytile_last_error(void) { return last_error.c_str(); }

polytile_status polytile_parse(const char* text, polytile_program** program) {
  return guarded([&] {
    if (!program) user_error("polytile_parse: the result pointer is NULL");
    *program = nullptr;
    *program = wrap(parse_program(need(text, "polytile_parse: the text"))).release();
  });
}

polytile_status polytile_parse_file(const char* path, polytile_program** program) {
  return guarded([&] {
    if (!program) user_error("polytile_parse_file: the result pointer is NULL");
    *program = nullptr;
    *program = wrap(parse_file(need(path, "polytile_parse_file: the path"))).release();
  });
}

const char* polytile_program_text(const polytile_program* program) { return program ? program->text.c_str() : ""; }

size_t polytile_program_input_count(const polytile_program* program) { return program ? program->program.inputs.size() : 0; }

const char* polytile_program_input(const polytile_program* program, size_t i) {
  return program && i < program->program.inputs.size() ? program->program.inputs[i].name.c_str() : nullptr;
}

size_t polytile_program_output_count(const polytile_program* program) { return program ? program->program.outputs.size() : 0; }

const char* polytile_program_output(const polytile_program* program, size_t i) {
  return program && i < program->program.outputs.size() ? program->program.outputs[i].c_str() : nullptr;
}

polytile_status polytile_check(const polytile_program* program, const polytile_tensor* input_types, size_t input_count) {
  return guarded([&] {
    const Program& p = need(program, "polytile_check: the program")->program;
    infer_types(p, types_of(input_types, input_count, "polytile_check: input_types"));
  });
}

polytile_status polytile_gradient(const polytile_program* program, const char* const* wrt, size_t wrt_count,
                                  polytile_program** gradient) {
  return guarded([&] {
    if (!gradient) user_error("polytile_gradient: the result pointer is NULL");
    *gradient = nullptr;
    const Program& p = need(program, "polytile_gradient: the program")->program;
    ad::Options o;
    if (wrt_count && !wrt) user_error("polytile_gradient: wrt is NULL");
    for (size_t i = 0; i < wrt_count; ++i) o.wrt.push_back(need(wrt[i], "polytile_gradient: a wrt name"));
    *gradient = wrap(ad::vjp(p, o).program).release();
  });
}

polytile_status polytile_compile(const polytile_program* program, const polytile_tensor* input_types, size_t input_count,
                                 const char* target, polytile_compiled** compiled) {
  return guarded([&] {
    if (!compiled) user_error("polytile_compile: the result pointer is NULL");
    *compiled = nullptr;
    const Program& p = need(program, "polytile_compile: the program")->program;
    const std::optional<std::string> cpu_name = cpu::cpu_of_target(target ? target : "cpu");
    if (!cpu_name) user_error("polytile_compile: unknown target '", target, "' (this build has: cpu, cpu:NAME)");
    const std::map<std::string, TensorType> types = types_of(input_types, input_count, "polytile_compile: input_types");
    cpu::CompileOptions options;
    options.target = cpu::cpu_target(*cpu_name);
    auto out = std::make_unique<polytile_compiled>();
    out->compiled = cpu::compile(p, types, options);
    for (const std::string& o : p.outputs) out->outputs[o] = out->compiled->types().tensors.at(o);
    *compiled = out.release();
  });
}

polytile_status polytile_output_type(const polytile_compiled* compiled, const char* output, polytile_dtype* dtype, int* rank,
                                     const int64_t** shape) {
  return guarded([&] {
    const polytile_compiled& c = *need(compiled, "polytile_output_type: the compiled program");
    std::string name = need(output, "polytile_output_type: the output name");
    auto it = c.outputs.find(name);
    if (it == c.outputs.end()) user_error("polytile_output_type: the program has no output ", name);
    if (dtype) *dtype = code_of(it->second.dtype);
    if (rank) *rank = static_cast<int>(it->second.shape.size());
    if (shape) *shape = it->second.shape.data();
  });
}

polytile_status polytile_run(const polytile_compiled* compiled, const polytile_tensor* inputs, size_t input_count,
                             const polytile_tensor* outputs, size_t output_count) {
  return guarded([&] {
    const polytile_compiled& c = *need(compiled, "polytile_run: the compiled program");
    c.compiled->run(views(inputs, input_count, "polytile_run: inputs"), views(outputs, output_count, "polytile_run: outputs"));
  });
}

void polytile_program_free(polytile_program* program) { delete program; }

void polytile_compiled_free(polytile_compiled* compiled) { delete compiled; }

}  // extern "C"
