// polytile._polytile: the Python package's native half (nanobind). Programs are parsed, differentiated,
// printed and compiled by the C++ libraries; compiled programs run on the callers' arrays through DLPack,
// in place: an input or output is never copied, only checked (device, dtype, shape, layout). The Python
// half (polytile/__init__.py) turns keyword arguments into the dictionaries taken here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "polytile/cpu.h"
#include "polytile/driver.h"
#include "polytile/error.h"
#include "polytile/interpreter.h"
#include "polytile/parser.h"
#include "polytile/shapes.h"

namespace nb = nanobind;
using namespace polytile;

namespace {

// A tensor type from Python: (shape, dtype name).
using PyType = std::pair<std::vector<int64_t>, std::string>;

DType dtype_named(const std::string& tensor, const std::string& name) {
  std::optional<DType> d = parse_dtype(name);
  if (!d) user_error("tensor ", tensor, ": unknown dtype '", name, "' (", dtype_list(), ")");
  return *d;
}

std::map<std::string, TensorType> types_of(const std::map<std::string, PyType>& types) {
  std::map<std::string, TensorType> out;
  for (const auto& [name, t] : types) {
    for (int64_t d : t.first)
      if (d < 0) user_error("tensor ", name, ": negative dimension ", d);
    out[name] = TensorType{dtype_named(name, t.second), t.first};
  }
  return out;
}

PyType py_type(const TensorType& t) { return {t.shape, to_string(t.dtype)}; }

// The DLPack dtype of an array as polytile's, or a UserError naming the tensor.
DType dtype_of(const std::string& role, const std::string& name, nb::dlpack::dtype d) {
  using code = nb::dlpack::dtype_code;
  if (d.lanes == 1) {
    if (d.code == uint8_t(code::Float) && d.bits == 16) return DType::f16;
    if (d.code == uint8_t(code::Float) && d.bits == 32) return DType::f32;
    if (d.code == uint8_t(code::Float) && d.bits == 64) return DType::f64;
    if (d.code == uint8_t(code::Int) && d.bits == 32) return DType::i32;
    if (d.code == uint8_t(code::Int) && d.bits == 64) return DType::i64;
    if (d.code == uint8_t(code::Bool) && d.bits == 8) return DType::boolean;
  }
  const char* kind = d.code == uint8_t(code::Float) ? "float" : d.code == uint8_t(code::Int) ? "int"
                     : d.code == uint8_t(code::UInt) ? "uint" : d.code == uint8_t(code::Bool) ? "bool" : "other";
  user_error(role, " ", name, ": dtype ", kind, int(d.bits), " is not one polytile computes in (", dtype_list(), ")");
}

// An array (anything with __dlpack__ or the buffer protocol) as a view of its memory, checked to be on
// the CPU; the layout and type are checked against the compiled ones by CompiledProgram::run.
template <typename Array>
TensorView view_of(const std::string& role, const std::string& name, nb::handle object, Array& keep) {
  if (!nb::try_cast(object, keep, /*convert=*/false))
    user_error(role, " ", name, ": expected an array (an object with __dlpack__ or the buffer protocol)",
               std::is_same_v<Array, nb::ndarray<>> ? " that is writable" : "", ", got ",
               nb::type_name(object.type()).c_str());
  if (keep.device_type() != nb::device::cpu::value)
    user_error(role, " ", name, ": the array is on device type ", keep.device_type(),
               ", not on the CPU (this program was compiled for the CPU)");
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(keep.data()));
  v.dtype = dtype_of(role, name, keep.dtype());
  for (size_t i = 0; i < keep.ndim(); ++i) {
    v.shape.push_back(static_cast<int64_t>(keep.shape(i)));
    if (keep.stride_ptr()) v.strides.push_back(keep.stride(i));
  }
  return v;
}

struct PyProgram {
  Program program;
};

// A compiled program with the names and types of its arguments. last_binding: the data pointers of the
// last run's arguments, so a caller (and the tests) can see that the arrays were used in place.
struct PyCompiled {
  std::shared_ptr<const cpu::CompiledProgram> compiled;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, TensorType> input_types, output_types;
  std::mutex mutex;
  std::map<std::string, uintptr_t> last_binding;
};

PyCompiled* compile_program(const PyProgram& p, const std::map<std::string, PyType>& types, const std::string& target, int threads,
                    bool verify) {
  const std::optional<std::string> cpu_name = cpu::cpu_of_target(target);
  if (!cpu_name)
    user_error("compile: unknown target '", target, "' (the Python package runs on: cpu, or cpu:NAME for the code of a CPU LLVM names)");
  auto out = std::make_unique<PyCompiled>();
  out->input_types = types_of(types);
  for (const auto& in : p.program.inputs) out->inputs.push_back(in.name);
  out->outputs = p.program.outputs;
  cpu::CompileOptions options;
  options.target = cpu::cpu_target(*cpu_name);
  options.threads = threads;
  options.verify = verify;
  {
    nb::gil_scoped_release release;
    out->compiled = cpu::compile(p.program, out->input_types, options);
  }
  for (const std::string& o : p.program.outputs) out->output_types[o] = out->compiled->types().tensors.at(o);
  return out.release();
}

void run_compiled(PyCompiled& c, const std::vector<nb::handle>& inputs, const std::vector<nb::handle>& outputs) {
  if (inputs.size() != c.inputs.size())
    user_error("run: the program takes ", c.inputs.size(), " inputs, got ", inputs.size());
  if (outputs.size() != c.outputs.size())
    user_error("run: the program writes ", c.outputs.size(), " outputs, got ", outputs.size());
  std::vector<nb::ndarray<nb::ro>> in_arrays(inputs.size());
  std::vector<nb::ndarray<>> out_arrays(outputs.size());
  ViewMap in_views, out_views;
  std::map<std::string, uintptr_t> binding;
  for (size_t i = 0; i < inputs.size(); ++i) {
    in_views[c.inputs[i]] = view_of("input", c.inputs[i], inputs[i], in_arrays[i]);
    binding[c.inputs[i]] = reinterpret_cast<uintptr_t>(in_views[c.inputs[i]].data);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    out_views[c.outputs[i]] = view_of("output", c.outputs[i], outputs[i], out_arrays[i]);
    binding[c.outputs[i]] = reinterpret_cast<uintptr_t>(out_views[c.outputs[i]].data);
  }
  {
    nb::gil_scoped_release release;  // other Python threads run meanwhile; the arrays stay referenced
    c.compiled->run(in_views, out_views);
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  c.last_binding = std::move(binding);
}

// A buffer handed to numpy without a copy: the array owns it through a capsule.
nb::object array_of(Buffer buffer) {
  auto* owned = new Buffer(std::move(buffer));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Buffer*>(p); });
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  nb::dlpack::dtype d = nb::dtype<bool>();
  switch (owned->dtype()) {
    case DType::f16: d = {uint8_t(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case DType::f32: d = nb::dtype<float>(); break;
    case DType::f64: d = nb::dtype<double>(); break;
    case DType::i32: d = nb::dtype<int32_t>(); break;
    case DType::i64: d = nb::dtype<int64_t>(); break;
    case DType::boolean: break;
  }
  return nb::ndarray<nb::numpy>(owned->data(), shape.size(), shape.data(), owner, nullptr, d).cast();
}

// The reference interpreter on copies of the inputs (it is the oracle, not the fast path).
nb::dict interpret_program(const PyProgram& p, const std::map<std::string, nb::handle>& inputs) {
  TensorMap in;
  std::vector<nb::ndarray<nb::ro>> keep(inputs.size());
  size_t k = 0;
  for (const auto& [name, object] : inputs) {
    TensorView v = view_of("input", name, object, keep[k++]);
    if (!v.contiguous()) user_error("input ", name, ": the array is not contiguous row-major (copy it first)");
    Buffer b(v.dtype, v.shape);
    if (b.byte_size()) std::memcpy(b.data(), v.data, b.byte_size());
    in.emplace(name, std::move(b));
  }
  TensorMap out;
  {
    nb::gil_scoped_release release;
    out = polytile::interpret(p.program, in);
  }
  nb::dict result;
  for (const std::string& o : p.program.outputs) result[o.c_str()] = array_of(std::move(out.at(o)));
  return result;
}

}  // namespace

NB_MODULE(_polytile, m) {
  m.doc() = "polytile's native half: parse, differentiate, print and compile Tile programs, run them on DLPack arrays";
  m.attr("__version__") = POLYTILE_VERSION;
  // User errors (bad text, shapes, arguments) are ValueErrors with the command line's message.
  nb::exception<UserError>(m, "Error", PyExc_ValueError);
  nb::exception<InternalError>(m, "InternalError", PyExc_RuntimeError);
  m.def("stages", [] { return driver::stages(); }, "The stages Program.lower prints, in pipeline order.");

  nb::class_<PyProgram>(m, "Program")
      .def_static("parse", [](const std::string& text) { return PyProgram{parse_program(text)}; }, nb::arg("text"))
      .def_static("parse_file", [](const std::string& path) { return PyProgram{parse_file(path)}; }, nb::arg("path"))
      .def("text", [](const PyProgram& p) { return print(p.program); })
      .def("inputs", [](const PyProgram& p) {
        std::vector<std::string> names;
        for (const auto& in : p.program.inputs) names.push_back(in.name);
        return names;
      })
      .def("outputs", [](const PyProgram& p) { return p.program.outputs; })
      .def("types", [](const PyProgram& p, const std::map<std::string, PyType>& inputs) {
        ProgramTypes all = infer_types(p.program, types_of(inputs));
        std::map<std::string, PyType> out;
        for (const auto& [name, t] : all.tensors) out[name] = py_type(t);
        return out;
      }, nb::arg("inputs"))
      .def("grad", [](const PyProgram& p, const std::vector<std::string>& wrt, const std::string& mode, bool reduce_and_defract,
                      bool verify, bool keep_zero_adjoints) {
        driver::GradRequest r{wrt, mode, reduce_and_defract, verify, !keep_zero_adjoints};
        return PyProgram{driver::gradient(p.program, r)};
      }, nb::arg("wrt"), nb::arg("mode"), nb::arg("reduce_and_defract"), nb::arg("verify"), nb::arg("keep_zero_adjoints"))
      .def("lower", [](const PyProgram& p, const std::string& stage, const std::map<std::string, PyType>& inputs,
                       const std::string& target, bool verify) {
        driver::StageRequest r;
        r.stage = stage;
        r.inputs = types_of(inputs);
        r.target = target;
        if (const std::optional<std::string> cpu_name = cpu::cpu_of_target(target)) {  // cpu:NAME: made for CPU NAME
          r.target = "cpu";
          r.cpu = *cpu_name;
        }
        r.verify = verify;
        nb::gil_scoped_release release;
        return driver::print_stage(p.program, r);
      }, nb::arg("stage"), nb::arg("inputs"), nb::arg("target"), nb::arg("verify"))
      .def("compile", &compile_program, nb::arg("inputs"), nb::arg("target"), nb::arg("threads"), nb::arg("verify"))
      .def("interpret", &interpret_program, nb::arg("inputs"));

  nb::class_<PyCompiled>(m, "Compiled")
      .def_ro("inputs", &PyCompiled::inputs)
      .def_ro("outputs", &PyCompiled::outputs)
      .def("input_types", [](const PyCompiled& c) {
        std::map<std::string, PyType> out;
        for (const auto& [name, t] : c.input_types) out[name] = py_type(t);
        return out;
      })
      .def("output_types", [](const PyCompiled& c) {
        std::map<std::string, PyType> out;
        for (const auto& [name, t] : c.output_types) out[name] = py_type(t);
        return out;
      })
      .def("run", &run_compiled, nb::arg("inputs"), nb::arg("outputs"))
      .def("last_binding", [](PyCompiled& c) {
        std::lock_guard<std::mutex> lock(c.mutex);
        return c.last_binding;
      })
      .def("llvm_ir", [](const PyCompiled& c) { return c.compiled->llvm_ir(); });
}
