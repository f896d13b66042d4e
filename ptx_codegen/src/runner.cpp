// Runs a kernel bundle: the primary context of one device, the module loaded with the JIT's logs kept,
// device buffers for the bundle's table, launches in order timed with events, outputs copied back.
#include <map>

#include "driver.h"
#include "polytile/error.h"

namespace polytile::cuda {

using namespace internal;

struct Runner::Impl {
  std::unique_ptr<DriverApi> api;
  DriverStatus status;
  CUdevice device = 0;
  CUcontext context = nullptr;

  // Throws the failure of `what` as a UserError in one line.
  void check(CUresult r, const std::string& what) const {
    if (r == CUDA_SUCCESS) return;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) user_error("the GPU is out of memory while ", what, " (", status.device_name, ")");
    user_error("CUDA failed while ", what, ": ", api->name(r));
  }
};

namespace {

// Device memory, freed on every path.
class DeviceBuffer {
 public:
  DeviceBuffer(const DriverApi& api, size_t bytes) : api_(api) {
    if (api_.cuMemAlloc(&ptr_, bytes == 0 ? 1 : bytes) != CUDA_SUCCESS) ptr_ = 0;
  }
  ~DeviceBuffer() {
    if (ptr_) api_.cuMemFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  CUdeviceptr* address() { return &ptr_; }

 private:
  const DriverApi& api_;
  CUdeviceptr ptr_ = 0;
};

class Module {
 public:
  explicit Module(const DriverApi& api) : api_(api) {}
  ~Module() {
    if (m_) api_.cuModuleUnload(m_);
  }
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  CUmodule* address() { return &m_; }
  CUmodule get() const { return m_; }

 private:
  const DriverApi& api_;
  CUmodule m_ = nullptr;
};

class Event {
 public:
  explicit Event(const DriverApi& api) : api_(api) {
    if (api_.cuEventCreate(&e_, 0) != CUDA_SUCCESS) e_ = nullptr;
  }
  ~Event() {
    if (e_) api_.cuEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return e_; }

 private:
  const DriverApi& api_;
  CUevent e_ = nullptr;
};

std::string first_line(const std::string& log) {
  std::string s = log.substr(0, log.find('\n'));
  return s.empty() ? "no log" : s;
}

int target_number(const std::string& target) { return std::stoi(target.substr(3)); }

}  // namespace

Runner::Runner(int device, const std::string& library) : impl_(std::make_unique<Impl>()) {
  LoadedDriver d = load_driver(library);
  impl_->status = d.status;
  if (d.status.state != DriverStatus::State::ready) user_error("cannot run on a GPU: ", d.status.line);
  impl_->api = std::move(d.api);
  int count = impl_->status.devices;
  if (device < 0 || device >= count) user_error("no CUDA device ", device, ": this machine has ", count);
  impl_->check(impl_->api->cuDeviceGet(&impl_->device, device), "opening device " + std::to_string(device));
  impl_->check(impl_->api->cuDevicePrimaryCtxRetain(&impl_->context, impl_->device), "creating the device's context");
  impl_->check(impl_->api->cuCtxSetCurrent(impl_->context), "making the device's context current");
}

Runner::~Runner() {
  if (impl_ && impl_->context) impl_->api->cuDevicePrimaryCtxRelease(impl_->device);
}

const DriverStatus& Runner::status() const { return impl_->status; }

TensorMap Runner::run(const KernelBundle& bundle, const TensorMap& inputs, double* kernel_ms) {
  const Impl& m = *impl_;
  const DriverApi& api = *m.api;
  m.check(api.cuCtxSetCurrent(m.context), "making the device's context current");
  const int have = m.status.major * 10 + m.status.minor;
  if (target_number(bundle.target) > have)
    user_error("the bundle is compiled for ", bundle.target, ", newer than this GPU (", m.status.device_name, ", sm_", have, ")");
  for (const auto& [name, b] : inputs) {
    bool known = false;
    for (const BundleBuffer& buf : bundle.buffers) known |= buf.name == name && buf.role == BundleBuffer::Role::input;
    if (!known) user_error("the bundle has no input ", name);
  }
  // Device memory for the buffer table: inputs copied, outputs and scratch zeroed.
  std::vector<std::unique_ptr<DeviceBuffer>> memory;
  std::map<std::string, size_t> slot;
  for (const BundleBuffer& buf : bundle.buffers) {
    size_t bytes = dtype_bytes(buf.type.dtype);
    for (int64_t extent : buf.type.shape) bytes *= static_cast<size_t>(extent);
    auto d = std::make_unique<DeviceBuffer>(api, bytes);
    if (!d->get()) user_error("the GPU is out of memory for buffer ", buf.name, " (", bytes, " bytes, ", m.status.device_name, ")");
    if (buf.role == BundleBuffer::Role::input) {
      auto it = inputs.find(buf.name);
      if (it == inputs.end()) user_error("missing input ", buf.name, " (", buf.type.str(), ")");
      if (it->second.dtype() != buf.type.dtype || it->second.shape() != buf.type.shape)
        user_error("input ", buf.name, " must be ", buf.type.str(), ", not ", TensorType{it->second.dtype(), it->second.shape()}.str());
      if (bytes) m.check(api.cuMemcpyHtoD(d->get(), it->second.data(), bytes), "copying input " + buf.name + " to the GPU");
    } else if (bytes) {
      m.check(api.cuMemsetD8(d->get(), 0, bytes), "zeroing buffer " + buf.name);
    }
    slot[buf.name] = memory.size();
    memory.push_back(std::move(d));
  }
  // The module, with the JIT's logs for a message.
  Module module(api);
  std::string error_log(8192, '\0'), info_log(8192, '\0');
  int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                   CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size()), info_log.data(),
                    reinterpret_cast<void*>(info_log.size())};
  if (CUresult r = api.cuModuleLoadDataEx(module.address(), bundle.ptx.c_str(), 4, options, values); r != CUDA_SUCCESS)
    user_error("the GPU's JIT rejected the bundle's PTX (", bundle.target, "): ", api.name(r), ": ", first_line(error_log.c_str()));
  std::vector<CUfunction> functions;
  for (const BundleKernel& k : bundle.kernels) {
    CUfunction f = nullptr;
    m.check(api.cuModuleGetFunction(&f, module.get(), k.name.c_str()), "finding kernel " + k.name);
    functions.push_back(f);
  }
  Event start(api), stop(api);
  if (!start.get() || !stop.get()) user_error("CUDA failed while creating timing events");
  m.check(api.cuEventRecord(start.get(), nullptr), "starting the timer");
  for (size_t i = 0; i < bundle.kernels.size(); ++i) {
    const BundleKernel& k = bundle.kernels[i];
    std::vector<void*> args;
    for (const std::string& a : k.args) args.push_back(memory[slot.at(a)]->address());
    m.check(api.cuLaunchKernel(functions[i], static_cast<unsigned>(k.grid[0]), static_cast<unsigned>(k.grid[1]),
                               static_cast<unsigned>(k.grid[2]), static_cast<unsigned>(k.block[0]), static_cast<unsigned>(k.block[1]),
                               static_cast<unsigned>(k.block[2]), static_cast<unsigned>(k.shared_bytes), nullptr, args.data(), nullptr),
            "launching kernel " + k.name);
  }
  m.check(api.cuEventRecord(stop.get(), nullptr), "stopping the timer");
  m.check(api.cuEventSynchronize(stop.get()), "running the kernels");
  float ms = 0;
  m.check(api.cuEventElapsedTime(&ms, start.get(), stop.get()), "reading the timer");
  if (kernel_ms) *kernel_ms = ms;
  TensorMap outputs;
  for (const BundleBuffer& buf : bundle.buffers) {
    if (buf.role != BundleBuffer::Role::output) continue;
    Buffer host(buf.type.dtype, buf.type.shape);
    if (host.byte_size())
      m.check(api.cuMemcpyDtoH(host.data(), memory[slot.at(buf.name)]->get(), host.byte_size()), "copying output " + buf.name + " back");
    outputs[buf.name] = std::move(host);
  }
  return outputs;
}

}  // namespace polytile::cuda
