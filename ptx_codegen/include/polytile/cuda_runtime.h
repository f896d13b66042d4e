// Running kernel bundles on an NVIDIA GPU. A bundle is PTX plus a manifest: the target (sm_XY), the
// buffer table (name, role, dtype, shape) and the kernels in launch order (entry name, grid, block,
// dynamic shared bytes, the buffers passed as arguments). The CUDA driver is loaded at run time with
// dlopen("libcuda.so.1") and its versioned entry points (cuMemAlloc_v2, ...): nothing links against
// CUDA, binaries start on machines without a GPU, and this library needs only the front end.
//
// Thread safety: driver_status may be called from any thread. A Runner owns device 0's primary context
// and device memory for its runs; use one Runner per thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "polytile/buffer.h"
#include "polytile/interpreter.h"  // TensorMap
#include "polytile/shapes.h"

namespace polytile::cuda {

// What this machine offers, said in one line.
struct DriverStatus {
  enum class State { no_driver, stub_library, no_device, ready };
  State state = State::no_driver;
  std::string line;         // e.g. "no CUDA driver: libcuda.so.1 cannot be loaded (...)"
  int devices = 0;
  std::string device_name;  // device 0, when ready
  int major = 0, minor = 0; // its compute capability
  int driver_version = 0;   // e.g. 13000
};
// Loads `library` (by default the driver the system's loader finds) and asks it: no library (or not a
// CUDA driver), the CUDA toolkit's stub library (cuInit answers CUDA_ERROR_STUB_LIBRARY), no usable
// device, or ready.
DriverStatus driver_status(const std::string& library = "libcuda.so.1");

struct BundleBuffer {
  enum class Role { input, output, scratch };
  std::string name;
  Role role = Role::input;
  TensorType type;
};

struct BundleKernel {
  std::string name;                       // the PTX .entry
  std::array<int64_t, 3> grid{1, 1, 1};   // blocks
  std::array<int64_t, 3> block{1, 1, 1};  // threads per block
  int64_t shared_bytes = 0;               // dynamic shared memory per block
  std::vector<std::string> args;          // buffers passed as the kernel's pointer arguments, in order
};

struct KernelBundle {
  std::string target;  // "sm_80", "sm_90", ...
  std::string ptx;
  std::vector<BundleBuffer> buffers;
  std::vector<BundleKernel> kernels;  // launched in this order

  // The manifest's text: one line per field, buffer and kernel, e.g.
  //   polytile kernel bundle 1
  //   target sm_90
  //   buffer A input f32 64x32
  //   kernel C_update grid 2 1 1 block 128 1 1 shared 0 args C A B
  std::string manifest() const;
  // DIR/manifest.txt and DIR/kernels.ptx (DIR is created).
  void write(const std::string& dir) const;
  // UserError naming the file and line for anything malformed or inconsistent (unknown buffers, a block
  // of more than 1024 threads, a target that is not sm_XY, ...).
  static KernelBundle read(const std::string& dir);
  static KernelBundle parse(const std::string& manifest, std::string ptx, const std::string& where = "manifest.txt");

  // The buffer `name`, or null.
  const BundleBuffer* find(const std::string& name) const;
  // The buffer `name` of `role`; UserError "the bundle has no output Z" (saying what it is where the
  // name is a buffer of another role).
  const BundleBuffer& buffer(const std::string& name, BundleBuffer::Role role) const;
  // UserError for a value that is not the input `name`'s dtype and shape, or a name that is no input.
  void check_input(const std::string& name, const Buffer& value) const;
  // check_input for each of `inputs`, and a UserError for an input they lack: what a run checks before
  // it asks for a GPU.
  void check_inputs(const TensorMap& inputs) const;
};

class Runner;

// A bundle loaded on the device: its module, its kernels and device memory for its buffer table, kept
// between launches (upload the inputs once, launch many times, download what is needed). Made by
// Runner::load; it keeps the runner's context alive. Not thread safe.
class LoadedBundle {
 public:
  ~LoadedBundle();
  LoadedBundle(const LoadedBundle&) = delete;
  LoadedBundle& operator=(const LoadedBundle&) = delete;
  const KernelBundle& bundle() const;
  // Copies `value` to the input buffer `name`; UserError for a name that is not an input of the bundle
  // or a value of another dtype or shape.
  void upload(const std::string& name, const Buffer& value);
  // Sets every byte of the outputs and scratch buffers: 0 is what Runner::run starts from; 0xff makes
  // every float NaN, so an element no kernel writes shows in the result.
  void fill(unsigned char byte);
  // Launches the kernels in order on the default stream and waits for them; returns their time in
  // milliseconds, measured with CUDA events around the launches.
  double launch();
  Buffer download(const std::string& output) const;
  // The device address of a buffer (in the runner's context), for a library that works on it in place.
  uint64_t device_address(const std::string& name) const;

 private:
  friend class Runner;
  struct Impl;
  explicit LoadedBundle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Runs bundles on one device, in its primary context. Every failure is a UserError in one line: the
// driver not ready (driver_status's line), a bundle for a newer GPU than this one, PTX the driver's JIT
// rejects (with its error log), out of device memory, a failed launch or copy (the CUresult's name).
class Runner {
 public:
  explicit Runner(int device = 0, const std::string& library = "libcuda.so.1");
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  const DriverStatus& status() const;
  // Loads the bundle's PTX (the driver's JIT) and allocates its buffers, outputs and scratch zeroed.
  std::unique_ptr<LoadedBundle> load(const KernelBundle& bundle);
  // load, then copies `inputs` (every input buffer, by name, of the bundle's types) to the device,
  // launches the kernels in order and returns the outputs. `kernel_ms` receives the time of the
  // launches alone, measured with CUDA events.
  TensorMap run(const KernelBundle& bundle, const TensorMap& inputs, double* kernel_ms = nullptr);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace polytile::cuda
