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
  ~Impl();  // releases the primary context

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
    // The kernels copy shared tiles in 16-byte vectors, trusting their buffers to be aligned so (the
    // driver aligns every allocation to 256 bytes).
    const CUdeviceptr at = ptr_;
    if (at % 16 != 0) api_.cuMemFree(ptr_), ptr_ = 0;
    POLYTILE_CHECK(at % 16 == 0, "the driver allocated device memory at ", at, ", not 16-byte aligned");
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

size_t buffer_bytes(const BundleBuffer& buf) {
  size_t bytes = dtype_bytes(buf.type.dtype);
  for (int64_t extent : buf.type.shape) bytes *= static_cast<size_t>(extent);
  return bytes;
}

}  // namespace

Runner::Runner(int device, const std::string& library) : impl_(std::make_shared<Impl>()) {
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

Runner::~Runner() = default;

Runner::Impl::~Impl() {
  if (context) api->cuDevicePrimaryCtxRelease(device);
}

const DriverStatus& Runner::status() const { return impl_->status; }

struct LoadedBundle::Impl {
  std::shared_ptr<const Runner::Impl> runner;  // declared first: destroyed last, after the module and memory
  KernelBundle bundle;
  std::unique_ptr<Module> module;
  std::vector<CUfunction> functions;
  std::vector<std::unique_ptr<DeviceBuffer>> memory;  // one per buffer of the table, in its order
  std::vector<std::vector<void*>> args;               // per kernel, its arguments' device pointers' addresses
  std::unique_ptr<Event> start, stop;

  const DriverApi& api() const { return *runner->api; }
  void current() const { runner->check(api().cuCtxSetCurrent(runner->context), "making the device's context current"); }
  // The device memory of the bundle's buffer `b`.
  DeviceBuffer& memory_of(const BundleBuffer& b) const { return *memory[static_cast<size_t>(&b - bundle.buffers.data())]; }
};

LoadedBundle::LoadedBundle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedBundle::~LoadedBundle() = default;

const KernelBundle& LoadedBundle::bundle() const { return impl_->bundle; }

std::unique_ptr<LoadedBundle> Runner::load(const KernelBundle& bundle) {
  const Impl& m = *impl_;
  const DriverApi& api = *m.api;
  m.check(api.cuCtxSetCurrent(m.context), "making the device's context current");
  const int have = m.status.major * 10 + m.status.minor;
  if (target_number(bundle.target) > have)
    user_error("the bundle is compiled for ", bundle.target, ", newer than this GPU (", m.status.device_name, ", sm_", have, ")");
  auto l = std::make_unique<LoadedBundle::Impl>();
  l->runner = impl_;
  l->bundle = bundle;
  // Device memory for the buffer table, outputs and scratch zeroed.
  for (const BundleBuffer& buf : bundle.buffers) {
    const size_t bytes = buffer_bytes(buf);
    auto d = std::make_unique<DeviceBuffer>(api, bytes);
    if (!d->get()) user_error("the GPU is out of memory for buffer ", buf.name, " (", bytes, " bytes, ", m.status.device_name, ")");
    l->memory.push_back(std::move(d));
  }
  // The module, with the JIT's logs for a message.
  l->module = std::make_unique<Module>(api);
  std::string error_log(8192, '\0'), info_log(8192, '\0');
  int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER,
                   CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log.data(), reinterpret_cast<void*>(error_log.size()), info_log.data(),
                    reinterpret_cast<void*>(info_log.size())};
  if (CUresult r = api.cuModuleLoadDataEx(l->module->address(), bundle.ptx.c_str(), 4, options, values); r != CUDA_SUCCESS)
    user_error("the GPU's JIT rejected the bundle's PTX (", bundle.target, "): ", api.name(r), ": ", first_line(error_log.c_str()));
  for (const BundleKernel& k : l->bundle.kernels) {
    CUfunction f = nullptr;
    m.check(api.cuModuleGetFunction(&f, l->module->get(), k.name.c_str()), "finding kernel " + k.name);
    l->functions.push_back(f);
    std::vector<void*>& args = l->args.emplace_back();
    for (const std::string& a : k.args) args.push_back(l->memory_of(*l->bundle.find(a)).address());
  }
  l->start = std::make_unique<Event>(api);
  l->stop = std::make_unique<Event>(api);
  if (!l->start->get() || !l->stop->get()) user_error("CUDA failed while creating timing events");
  std::unique_ptr<LoadedBundle> out(new LoadedBundle(std::move(l)));
  out->fill(0);
  return out;
}

void LoadedBundle::upload(const std::string& name, const Buffer& value) {
  const Impl& l = *impl_;
  l.bundle.check_input(name, value);
  l.current();
  if (value.byte_size())
    l.runner->check(l.api().cuMemcpyHtoD(l.memory_of(*l.bundle.find(name)).get(), value.data(), value.byte_size()),
                    "copying input " + name + " to the GPU");
}

void LoadedBundle::fill(unsigned char byte) {
  const Impl& l = *impl_;
  l.current();
  for (const BundleBuffer& buf : l.bundle.buffers) {
    if (buf.role == BundleBuffer::Role::input) continue;
    if (const size_t bytes = buffer_bytes(buf))
      l.runner->check(l.api().cuMemsetD8(l.memory_of(buf).get(), byte, bytes), "filling buffer " + buf.name);
  }
}

double LoadedBundle::launch() {
  Impl& l = *impl_;
  const DriverApi& api = l.api();
  const Runner::Impl& m = *l.runner;
  l.current();
  m.check(api.cuEventRecord(l.start->get(), nullptr), "starting the timer");
  for (size_t i = 0; i < l.bundle.kernels.size(); ++i) {
    const BundleKernel& k = l.bundle.kernels[i];
    m.check(api.cuLaunchKernel(l.functions[i], static_cast<unsigned>(k.grid[0]), static_cast<unsigned>(k.grid[1]),
                               static_cast<unsigned>(k.grid[2]), static_cast<unsigned>(k.block[0]), static_cast<unsigned>(k.block[1]),
                               static_cast<unsigned>(k.block[2]), static_cast<unsigned>(k.shared_bytes), nullptr, l.args[i].data(), nullptr),
            "launching kernel " + k.name);
  }
  m.check(api.cuEventRecord(l.stop->get(), nullptr), "stopping the timer");
  m.check(api.cuEventSynchronize(l.stop->get()), "running the kernels");
  float ms = 0;
  m.check(api.cuEventElapsedTime(&ms, l.start->get(), l.stop->get()), "reading the timer");
  return ms;
}

Buffer LoadedBundle::download(const std::string& name) const {
  const Impl& l = *impl_;
  const BundleBuffer& buf = l.bundle.buffer(name, BundleBuffer::Role::output);
  Buffer host(buf.type.dtype, buf.type.shape);
  l.current();
  if (host.byte_size())
    l.runner->check(l.api().cuMemcpyDtoH(host.data(), l.memory_of(buf).get(), host.byte_size()), "copying output " + name + " back");
  return host;
}

uint64_t LoadedBundle::device_address(const std::string& name) const {
  const Impl& l = *impl_;
  const BundleBuffer* buf = l.bundle.find(name);
  if (!buf) user_error("the bundle has no buffer ", name);
  return l.memory_of(*buf).get();
}

TensorMap Runner::run(const KernelBundle& bundle, const TensorMap& inputs, double* kernel_ms) {
  bundle.check_inputs(inputs);
  std::unique_ptr<LoadedBundle> loaded = load(bundle);
  for (const auto& [name, b] : inputs) loaded->upload(name, b);
  const double ms = loaded->launch();
  if (kernel_ms) *kernel_ms = ms;
  TensorMap outputs;
  for (const BundleBuffer& buf : bundle.buffers)
    if (buf.role == BundleBuffer::Role::output) outputs[buf.name] = loaded->download(buf.name);
  return outputs;
}

}  // namespace polytile::cuda
