// GPU benchmarks: polytile's kernel bundles against cuBLAS and cuDNN on the same device, in one run.
//
//   polytile_gpu_bench --bundles DIR [Google Benchmark flags]
//
// DIR holds the bundles that bench/gpu_kit.py compiles on a machine with LLVM (`polytile compile`), one
// folder per case and direction: DIR/matmul_4096/fwd, DIR/conv3x3_64_56/bwd_data, ... This binary needs
// only the CUDA runtime, cuBLAS and cuDNN, so it runs on a GPU machine without LLVM, isl or NTL. The peer
// of a case follows from its name (matmul_*: cublasSgemm; conv*: cuDNN's fastest algorithm, found with
// cudnnFind*), its sizes from the bundle's buffer table. Every time is of the device alone (CUDA events
// around the launches; Google Benchmark's manual time), inputs resident, the same FLOP count for both
// sides. The peers run in strict FP32 (cuDNN's FMA math, cuBLAS's default math, no TF32), as polytile's
// kernels do; "cudnn_tf32" shows what the tensor cores' TF32 mode gives cuDNN.
// Layouts: polytile's convolution is NHWC with HWIO filters, as written in Tile; cuDNN's is NHWC with
// OHWI filters (it has no HWIO), which is the same arithmetic.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "polytile/cuda_runtime.h"
#include "polytile/error.h"

namespace {

namespace fs = std::filesystem;
using namespace polytile;
using cuda::BundleBuffer;
using cuda::KernelBundle;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) user_error("CUDA runtime failed in ", what, ": ", cudaGetErrorString(e));
}
void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) user_error("cuBLAS failed in ", what, ": status ", static_cast<int>(s));
}
void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) user_error("cuDNN failed in ", what, ": ", cudnnGetErrorString(s));
}


// The shape of the bundle's buffer `name`.
const std::vector<int64_t>& shape(const KernelBundle& b, const std::string& name) {
  const BundleBuffer* buf = b.find(name);
  if (!buf) user_error("the bundle has no buffer ", name);
  return buf->type.shape;
}

// matmul: C[i, j] = +(A[i, k] * B[k, j]).
struct MatmulShape {
  int64_t m, n, k;
  explicit MatmulShape(const KernelBundle& b) : m(shape(b, "A").at(0)), n(shape(b, "B").at(1)), k(shape(b, "A").at(1)) {}
  double flops() const { return 2.0 * m * n * k; }
};

// conv: O[n, y, x, co] = +(I[n, S*y + D*j - P, S*x + D*i - P, ci] * K[j, i, ci, co]) and its gradients
// (which take DO, of O's shape). Stride S and dilation D come from the family's name (`_s3`, `_d2`; 1
// without), the padding P from the shapes; a shape cuDNN would compute differently is refused.
struct ConvShape {
  int64_t n, h, w, ci, co, kh, kw, oh, ow, stride = 1, dilation = 1, pad;
  ConvShape(const KernelBundle& b, const std::string& family) {
    const auto& i = shape(b, "I");
    const auto& k = shape(b, "K");
    const auto& o = shape(b, b.find("DO") ? "DO" : "O");
    n = i.at(0), h = i.at(1), w = i.at(2), ci = i.at(3), kh = k.at(0), kw = k.at(1), co = k.at(3);
    oh = o.at(1), ow = o.at(2);
    for (const auto& [key, field] : {std::pair{std::string("_s"), &stride}, std::pair{std::string("_d"), &dilation}}) {
      const size_t at = family.find(key);
      if (at != std::string::npos && at + 2 < family.size() && std::isdigit(static_cast<unsigned char>(family[at + 2])))
        *field = std::stoll(family.substr(at + 2));
    }
    pad = std::max<int64_t>(0, ((oh - 1) * stride + dilation * (kh - 1) + 1 - h + 1) / 2);
    for (const auto& [in, k_, out] : {std::tuple{h, kh, oh}, std::tuple{w, kw, ow}})
      if ((in + 2 * pad - dilation * (k_ - 1) - 1) / stride + 1 != out)
        user_error("bundle of ", family, ": an output of ", out, " from an input of ", in, " with a filter of ", k_, ", stride ", stride,
                   " and dilation ", dilation, " needs uneven padding, which cuDNN does not do");
  }
  // Every multiply-add of the forward convolution, also for its gradients.
  double flops() const { return 2.0 * n * oh * ow * co * ci * kh * kw; }
};

// Device memory for a peer.
struct DeviceFloats {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceFloats(size_t count) : n(count) { check_cuda(cudaMalloc(&p, n * sizeof(float) + 4), "cudaMalloc"); }
  ~DeviceFloats() { cudaFree(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void upload(const std::vector<float>& h) {
    check_cuda(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
  }
  std::vector<float> download() const {
    std::vector<float> h(n);
    check_cuda(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
    return h;
  }
};

std::vector<float> floats(const Buffer& b) {
  std::vector<float> v(static_cast<size_t>(b.size()));
  for (int64_t i = 0; i < b.size(); ++i) v[static_cast<size_t>(i)] = static_cast<float>(b.get(i));
  return v;
}

// Times `launch` with CUDA events per iteration.
template <typename F>
void time_device(benchmark::State& state, F&& launch) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) launch();  // warm-up: module load, autotuning caches, clocks
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  for (auto _ : state) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    launch();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "the timed launch");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms * 1e-3);
  }
  check_cuda(cudaGetLastError(), "a launch");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// ---------------------------------------------------------------------------------------------- cases

// The vendor library a case is measured against, from its family's name.
enum class PeerKind { cublas, cudnn };

struct Case {
  std::string name;       // "conv3x3_64_56/bwd_data"
  std::string family;     // "conv3x3_64_56"
  std::string direction;  // "fwd", "bwd_data", "bwd_weights"
  KernelBundle bundle;
  PeerKind peer = PeerKind::cublas;
  double flops = 0;
  std::string output;  // the bundle's one output: C, O, DI or DK
};

Buffer random_buffer(const TensorType& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buffer b(t.dtype, t.shape);
  for (int64_t i = 0; i < b.size(); ++i) b.set(i, static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5);
  return b;
}

// The bundle's inputs, random (the same for polytile and its peer).
TensorMap random_inputs(const KernelBundle& b) {
  TensorMap in;
  uint64_t seed = 1;
  for (const BundleBuffer& buf : b.buffers)
    if (buf.role == BundleBuffer::Role::input) in[buf.name] = random_buffer(buf.type, seed++);
  return in;
}

// A vendor library computing what a case's bundle computes, on the same inputs.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void upload(const TensorMap& inputs) = 0;  // polytile's inputs, in polytile's layouts
  virtual void run() = 0;
  virtual Buffer result() const = 0;  // in polytile's layout, as the case's output
};

// matmul: C[i, j] = +(A[i, k] * B[k, j]), cublasSgemm in FP32 (no TF32).
class CublasMatmul : public Peer {
 public:
  explicit CublasMatmul(const KernelBundle& b)
      : s_(b), a_(s_.m * s_.k), b_(s_.k * s_.n), c_(s_.m * s_.n) {
    check_cublas(cublasCreate(&h_), "cublasCreate");
    check_cublas(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~CublasMatmul() override { cublasDestroy(h_); }
  void upload(const TensorMap& in) override {
    a_.upload(floats(in.at("A")));
    b_.upload(floats(in.at("B")));
  }
  // Row-major C = A B is column-major C^T = B^T A^T.
  void run() override {
    const float one = 1, zero = 0;
    const int m = static_cast<int>(s_.m), n = static_cast<int>(s_.n), k = static_cast<int>(s_.k);
    check_cublas(cublasSgemm(h_, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b_.p, n, a_.p, k, &zero, c_.p, n), "cublasSgemm");
  }
  Buffer result() const override {
    Buffer out(DType::f32, {s_.m, s_.n});
    std::vector<float> h = c_.download();
    for (size_t i = 0; i < h.size(); ++i) out.set(static_cast<int64_t>(i), h[i]);
    return out;
  }

 private:
  MatmulShape s_;
  cublasHandle_t h_{};
  DeviceFloats a_, b_, c_;
};

// conv: O[n, y, x, co] = +(I[n, S*y + D*j - P, S*x + D*i - P, ci] * K[j, i, ci, co]) and its gradients;
// cuDNN in NHWC with OHWI filters (it has no HWIO), the fastest algorithm cudnnFind* measures.
class CudnnConv : public Peer {
 public:
  CudnnConv(const KernelBundle& b, const std::string& family, const std::string& direction, bool tf32)
      : direction_(direction), s_(b, family) {
    xs_ = std::make_unique<DeviceFloats>(s_.n * s_.h * s_.w * s_.ci);
    ws_ = std::make_unique<DeviceFloats>(s_.kh * s_.kw * s_.ci * s_.co);
    ys_ = std::make_unique<DeviceFloats>(s_.n * s_.oh * s_.ow * s_.co);
    check_cudnn(cudnnCreate(&handle_), "cudnnCreate");
    check_cudnn(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&wd_), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
    auto i32 = [](int64_t v) { return static_cast<int>(v); };
    check_cudnn(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, i32(s_.n), i32(s_.ci), i32(s_.h), i32(s_.w)), "x");
    check_cudnn(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, i32(s_.n), i32(s_.co), i32(s_.oh), i32(s_.ow)), "y");
    check_cudnn(cudnnSetFilter4dDescriptor(wd_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, i32(s_.co), i32(s_.ci), i32(s_.kh), i32(s_.kw)), "w");
    check_cudnn(cudnnSetConvolution2dDescriptor(conv_, i32(s_.pad), i32(s_.pad), i32(s_.stride), i32(s_.stride), i32(s_.dilation),
                                                i32(s_.dilation), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionMathType(conv_, tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
    int found = 0;
    if (direction_ == "fwd") {
      cudnnConvolutionFwdAlgoPerf_t perf;
      check_cudnn(cudnnFindConvolutionForwardAlgorithm(handle_, x_, wd_, conv_, y_, 1, &found, &perf), "cudnnFindConvolutionForwardAlgorithm");
      fwd_ = perf.algo, workspace_bytes_ = perf.memory;
    } else if (direction_ == "bwd_data") {
      cudnnConvolutionBwdDataAlgoPerf_t perf;
      check_cudnn(cudnnFindConvolutionBackwardDataAlgorithm(handle_, wd_, y_, conv_, x_, 1, &found, &perf),
                  "cudnnFindConvolutionBackwardDataAlgorithm");
      bwd_data_ = perf.algo, workspace_bytes_ = perf.memory;
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf;
      check_cudnn(cudnnFindConvolutionBackwardFilterAlgorithm(handle_, x_, y_, conv_, wd_, 1, &found, &perf),
                  "cudnnFindConvolutionBackwardFilterAlgorithm");
      bwd_filter_ = perf.algo, workspace_bytes_ = perf.memory;
    }
    if (found < 1) user_error("cuDNN found no algorithm");
    check_cuda(cudaMalloc(&workspace_, workspace_bytes_ + 16), "cudaMalloc (workspace)");
  }
  ~CudnnConv() override {
    cudaFree(workspace_);
    cudnnDestroyConvolutionDescriptor(conv_);
    cudnnDestroyFilterDescriptor(wd_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyTensorDescriptor(x_);
    cudnnDestroy(handle_);
  }
  void upload(const TensorMap& in) override {
    if (in.count("I")) xs_->upload(floats(in.at("I")));
    if (in.count("DO")) ys_->upload(floats(in.at("DO")));
    if (in.count("K")) ws_->upload(filters(floats(in.at("K")), true));
  }
  void run() override {
    const float one = 1, zero = 0;
    if (direction_ == "fwd")
      check_cudnn(cudnnConvolutionForward(handle_, &one, x_, xs_->p, wd_, ws_->p, conv_, fwd_, workspace_, workspace_bytes_, &zero, y_, ys_->p),
                  "cudnnConvolutionForward");
    else if (direction_ == "bwd_data")
      check_cudnn(cudnnConvolutionBackwardData(handle_, &one, wd_, ws_->p, y_, ys_->p, conv_, bwd_data_, workspace_, workspace_bytes_, &zero,
                                               x_, xs_->p),
                  "cudnnConvolutionBackwardData");
    else
      check_cudnn(cudnnConvolutionBackwardFilter(handle_, &one, x_, xs_->p, y_, ys_->p, conv_, bwd_filter_, workspace_, workspace_bytes_,
                                                 &zero, wd_, ws_->p),
                  "cudnnConvolutionBackwardFilter");
  }
  Buffer result() const override {
    std::vector<float> h;
    std::vector<int64_t> shape;
    if (direction_ == "fwd") {
      h = ys_->download(), shape = {s_.n, s_.oh, s_.ow, s_.co};
    } else if (direction_ == "bwd_data") {
      h = xs_->download(), shape = {s_.n, s_.h, s_.w, s_.ci};
    } else {
      h = filters(ws_->download(), false), shape = {s_.kh, s_.kw, s_.ci, s_.co};
    }
    Buffer out(DType::f32, shape);
    for (size_t i = 0; i < h.size(); ++i) out.set(static_cast<int64_t>(i), h[i]);
    return out;
  }

 private:
  // Filters between Tile's HWIO and cuDNN's OHWI layout.
  std::vector<float> filters(const std::vector<float>& from, bool to_ohwi) const {
    std::vector<float> out(from.size());
    for (int64_t j = 0; j < s_.kh * s_.kw; ++j)
      for (int64_t c = 0; c < s_.ci; ++c)
        for (int64_t f = 0; f < s_.co; ++f) {
          const auto hwio = static_cast<size_t>((j * s_.ci + c) * s_.co + f), ohwi = static_cast<size_t>((f * s_.kh * s_.kw + j) * s_.ci + c);
          out[to_ohwi ? ohwi : hwio] = from[to_ohwi ? hwio : ohwi];
        }
    return out;
  }

  std::string direction_;
  ConvShape s_;
  std::unique_ptr<DeviceFloats> xs_, ws_, ys_;
  cudnnHandle_t handle_{};
  cudnnTensorDescriptor_t x_{}, y_{};
  cudnnFilterDescriptor_t wd_{};
  cudnnConvolutionDescriptor_t conv_{};
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

std::unique_ptr<Peer> peer_of(const Case& c, bool tf32) {
  if (c.peer == PeerKind::cublas) return std::make_unique<CublasMatmul>(c.bundle);
  return std::make_unique<CudnnConv>(c.bundle, c.family, c.direction, tf32);
}

// polytile's output (NaN-poisoned before the launch) against the peer's on the same random inputs.
bool check(const Case& c, cuda::Runner& runner) {
  std::unique_ptr<Peer> peer = peer_of(c, false);
  TensorMap in = random_inputs(c.bundle);
  std::unique_ptr<cuda::LoadedBundle> loaded = runner.load(c.bundle);
  for (const auto& [name, value] : in) loaded->upload(name, value);
  loaded->fill(0xff);
  loaded->launch();
  peer->upload(in);
  peer->run();
  check_cuda(cudaDeviceSynchronize(), "the peer");
  const Difference d = difference(loaded->download(c.output), peer->result());
  const bool ok = d.within(1e-5);
  std::cout << (ok ? "ok   " : "FAIL ") << c.name << ": polytile's " << c.output << " against the peer's, relative error " << d.relative;
  if (d.unexpected_nan) std::cout << ", " << d.unexpected_nan << " elements NaN (not written?)";
  std::cout << "\n";
  return ok;
}

void BM_Polytile(benchmark::State& state, const Case* c, cuda::Runner* runner) {
  std::unique_ptr<cuda::LoadedBundle> loaded = runner->load(c->bundle);
  for (const auto& [name, value] : random_inputs(c->bundle)) loaded->upload(name, value);
  for (int i = 0; i < 3; ++i) loaded->launch();
  for (auto _ : state) state.SetIterationTime(loaded->launch() * 1e-3);
  state.counters["GFLOP/s"] = benchmark::Counter(c->flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Peer(benchmark::State& state, const Case* c, bool tf32) {
  std::unique_ptr<Peer> peer = peer_of(*c, tf32);
  peer->upload(random_inputs(c->bundle));
  time_device(state, [&] { peer->run(); });
  state.counters["GFLOP/s"] = benchmark::Counter(c->flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Every bundle under DIR/<family>/<direction>, in name order.
std::vector<Case> read_cases(const fs::path& dir) {
  std::vector<Case> cases;
  if (!fs::is_directory(dir)) user_error("no bundle folder ", dir.string(), " (make one with bench/gpu_kit.py)");
  for (const auto& family : fs::directory_iterator(dir)) {
    if (!family.is_directory()) continue;
    for (const auto& direction : fs::directory_iterator(family.path())) {
      if (!fs::exists(direction.path() / "manifest.txt")) continue;
      Case c;
      c.family = family.path().filename().string();
      c.direction = direction.path().filename().string();
      c.name = c.family + "/" + c.direction;
      c.bundle = KernelBundle::read(direction.path().string());
      // Every case has its peer: a benchmark is a ratio.
      if (c.family.rfind("matmul", 0) == 0) {
        c.peer = PeerKind::cublas;
        c.flops = MatmulShape(c.bundle).flops();
      } else if (c.family.rfind("conv", 0) == 0) {
        c.peer = PeerKind::cudnn;
        c.flops = ConvShape(c.bundle, c.family).flops();
      } else {
        user_error("bundle ", c.name, ": no peer for family ", c.family, " (matmul_* is measured against cuBLAS, conv* against cuDNN)");
      }
      for (const BundleBuffer& b : c.bundle.buffers)
        if (b.role == BundleBuffer::Role::output) c.output = b.name;
      cases.push_back(std::move(c));
    }
  }
  std::sort(cases.begin(), cases.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
  if (cases.empty()) user_error("no bundles under ", dir.string());
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "gpu_bundles";
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bundles" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a.rfind("--bundles=", 0) == 0) {
      dir = a.substr(10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  try {
    cuda::DriverStatus s = cuda::driver_status();
    if (s.state != cuda::DriverStatus::State::ready) {
      std::cout << "polytile_gpu_bench: nothing to measure without a GPU: " << s.line << "\n";
      return 0;
    }
    const std::vector<Case> cases = read_cases(dir);  // they and the runner outlive the run below
    cuda::Runner runner;
    std::cout << runner.status().line << "; cuDNN " << cudnnGetVersion() << ", CUDA runtime " << CUDART_VERSION << "\n";
    // Correct first: a case whose output differs from its peer's is not timed, and the run fails.
    bool all_ok = true;
    for (const Case& c : cases) {
      const bool ok = check(c, runner);
      all_ok &= ok;
      if (!ok) continue;
      auto add = [&](const std::string& who, auto fn, auto... args) {
        benchmark::RegisterBenchmark((c.name + "/" + who).c_str(), fn, &c, args...)->UseManualTime()->Unit(benchmark::kMillisecond);
      };
      add("polytile", BM_Polytile, &runner);
      if (c.peer == PeerKind::cublas) {
        add("cublas", BM_Peer, false);
      } else {
        add("cudnn", BM_Peer, false);
        add("cudnn_tf32", BM_Peer, true);
      }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "polytile_gpu_bench: error: " << e.what() << "\n";
    return 1;
  }
}
