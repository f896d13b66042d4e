// The CUDA driver, found at run time: dlopen, the entry points by their versioned names, and the one-line
// answer to "can this machine run a bundle?".
#include "driver.h"

#include <dlfcn.h>

namespace polytile::cuda::internal {

DriverApi::~DriverApi() {
  if (handle) dlclose(handle);
}

std::string DriverApi::name(CUresult r) const {
  const char* n = nullptr;
  const char* s = nullptr;
  if (cuGetErrorName && cuGetErrorName(r, &n) == CUDA_SUCCESS && n) {
    std::string out = n;
    if (cuGetErrorString && cuGetErrorString(r, &s) == CUDA_SUCCESS && s) out += std::string(" (") + s + ")";
    return out;
  }
  return "CUresult " + std::to_string(r);
}

namespace {

template <typename F>
bool resolve(void* handle, F& fn, const char* name, const char* fallback = nullptr) {
  void* p = dlsym(handle, name);
  if (!p && fallback) p = dlsym(handle, fallback);
  fn = reinterpret_cast<F>(p);
  return p != nullptr;
}

// Every entry point; the name of the first one missing, or "".
std::string resolve_all(DriverApi& d) {
  std::string missing;
  auto need = [&](bool found, const char* name) {
    if (!found && missing.empty()) missing = name;
  };
  void* h = d.handle;
  need(resolve(h, d.cuInit, "cuInit"), "cuInit");
  need(resolve(h, d.cuDriverGetVersion, "cuDriverGetVersion"), "cuDriverGetVersion");
  need(resolve(h, d.cuGetErrorName, "cuGetErrorName"), "cuGetErrorName");
  need(resolve(h, d.cuGetErrorString, "cuGetErrorString"), "cuGetErrorString");
  need(resolve(h, d.cuDeviceGetCount, "cuDeviceGetCount"), "cuDeviceGetCount");
  need(resolve(h, d.cuDeviceGet, "cuDeviceGet"), "cuDeviceGet");
  need(resolve(h, d.cuDeviceGetName, "cuDeviceGetName"), "cuDeviceGetName");
  need(resolve(h, d.cuDeviceGetAttribute, "cuDeviceGetAttribute"), "cuDeviceGetAttribute");
  need(resolve(h, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"), "cuDevicePrimaryCtxRetain");
  need(resolve(h, d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"), "cuDevicePrimaryCtxRelease_v2");
  need(resolve(h, d.cuCtxSetCurrent, "cuCtxSetCurrent"), "cuCtxSetCurrent");
  need(resolve(h, d.cuCtxSynchronize, "cuCtxSynchronize"), "cuCtxSynchronize");
  need(resolve(h, d.cuModuleLoadDataEx, "cuModuleLoadDataEx"), "cuModuleLoadDataEx");
  need(resolve(h, d.cuModuleGetFunction, "cuModuleGetFunction"), "cuModuleGetFunction");
  need(resolve(h, d.cuModuleUnload, "cuModuleUnload"), "cuModuleUnload");
  need(resolve(h, d.cuMemAlloc, "cuMemAlloc_v2"), "cuMemAlloc_v2");
  need(resolve(h, d.cuMemFree, "cuMemFree_v2"), "cuMemFree_v2");
  need(resolve(h, d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"), "cuMemcpyHtoD_v2");
  need(resolve(h, d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"), "cuMemcpyDtoH_v2");
  need(resolve(h, d.cuMemsetD8, "cuMemsetD8_v2"), "cuMemsetD8_v2");
  need(resolve(h, d.cuLaunchKernel, "cuLaunchKernel"), "cuLaunchKernel");
  need(resolve(h, d.cuEventCreate, "cuEventCreate"), "cuEventCreate");
  need(resolve(h, d.cuEventRecord, "cuEventRecord"), "cuEventRecord");
  need(resolve(h, d.cuEventSynchronize, "cuEventSynchronize"), "cuEventSynchronize");
  need(resolve(h, d.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"), "cuEventElapsedTime");
  need(resolve(h, d.cuEventDestroy, "cuEventDestroy_v2"), "cuEventDestroy_v2");
  return missing;
}

}  // namespace

LoadedDriver load_driver(const std::string& library) {
  using State = DriverStatus::State;
  LoadedDriver out;
  DriverStatus& s = out.status;
  auto api = std::make_unique<DriverApi>();
  dlerror();
  api->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->handle) {
    const char* why = dlerror();
    s.line = "no CUDA driver: " + library + " cannot be loaded (" + (why ? why : "unknown reason") + ")";
    return out;
  }
  // The stub library answers every call, cuInit with CUDA_ERROR_STUB_LIBRARY: ask it before requiring
  // every entry point, so that a stub or an old driver is named as such.
  if (!resolve(api->handle, api->cuInit, "cuInit")) {
    s.line = "no CUDA driver: " + library + " has no cuInit (it is not the CUDA driver library)";
    return out;
  }
  resolve(api->handle, api->cuGetErrorName, "cuGetErrorName");
  resolve(api->handle, api->cuGetErrorString, "cuGetErrorString");
  const CUresult init = api->cuInit(0);
  if (init == CUDA_ERROR_STUB_LIBRARY) {
    s.state = State::stub_library;
    s.line = "CUDA stub library: " + library + " is the toolkit's stub, not a driver (cuInit: CUDA_ERROR_STUB_LIBRARY); no GPU";
    return out;
  }
  if (std::string missing = resolve_all(*api); !missing.empty()) {
    s.line = "no CUDA driver: " + library + " lacks " + missing + " (a driver older than CUDA 12?)";
    return out;
  }
  api->cuDriverGetVersion(&s.driver_version);
  const std::string version = std::to_string(s.driver_version / 1000) + "." + std::to_string(s.driver_version % 1000 / 10);
  if (init == CUDA_ERROR_NO_DEVICE) {
    s.state = State::no_device;
    s.line = "no CUDA device: driver " + version + " found no GPU (CUDA_ERROR_NO_DEVICE)";
    return out;
  }
  if (init != CUDA_SUCCESS) {
    s.state = State::no_device;
    s.line = "no CUDA device: driver " + version + " failed to start: " + api->name(init);
    return out;
  }
  if (CUresult r = api->cuDeviceGetCount(&s.devices); r != CUDA_SUCCESS || s.devices == 0) {
    s.state = State::no_device;
    s.line = "no CUDA device: driver " + version + " reports " + (r == CUDA_SUCCESS ? "0 devices" : api->name(r));
    return out;
  }
  CUdevice dev = 0;
  char name[256] = {0};
  if (api->cuDeviceGet(&dev, 0) != CUDA_SUCCESS || api->cuDeviceGetName(name, sizeof(name) - 1, dev) != CUDA_SUCCESS ||
      api->cuDeviceGetAttribute(&s.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
      api->cuDeviceGetAttribute(&s.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS) {
    s.state = State::no_device;
    s.line = "no CUDA device: driver " + version + " cannot describe device 0";
    return out;
  }
  s.state = State::ready;
  s.device_name = name;
  s.line = "ready: " + s.device_name + " (sm_" + std::to_string(s.major) + std::to_string(s.minor) + "), " +
           std::to_string(s.devices) + " device" + (s.devices == 1 ? "" : "s") + ", driver " + version;
  out.api = std::move(api);
  return out;
}

}  // namespace polytile::cuda::internal

namespace polytile::cuda {

DriverStatus driver_status(const std::string& library) { return internal::load_driver(library).status; }

}  // namespace polytile::cuda
