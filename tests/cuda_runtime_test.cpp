// The CUDA runtime without a GPU (and with one, where a machine has it): the driver's state in one line
// for a missing library, a library that is not a driver and the CUDA toolkit's stub library; kernel
// bundles written, read back and refused when malformed; the test bundle's PTX accepted by ptxas; and, on
// a GPU, the bundle run against values computed here. Links only the front end and the runtime.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "polytile/cuda_runtime.h"
#include "polytile/error.h"

namespace polytile::cuda {
namespace {

namespace fs = std::filesystem;
using State = DriverStatus::State;

// The source tree: where this test was built from, or $POLYTILE_SOURCE_DIR (a copy of the tree on a GPU
// machine that runs a test binary built elsewhere).
std::string source_dir() {
  const char* env = std::getenv("POLYTILE_SOURCE_DIR");
  return env ? env : POLYTILE_SOURCE_DIR;
}
const std::string kBundle = source_dir() + "/tests/data/bundles/add_twice";

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("polytile_cuda_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string cuda_home() {
  const char* env = std::getenv("CUDA_PATH");
  return env ? env : "/usr/local/cuda";
}

TEST(CudaRuntimeTest, AMissingDriverLibraryIsSaidInOneLine) {
  DriverStatus s = driver_status("libpolytile_no_such_driver.so.1");
  EXPECT_EQ(s.state, State::no_driver);
  EXPECT_NE(s.line.find("no CUDA driver: libpolytile_no_such_driver.so.1 cannot be loaded"), std::string::npos) << s.line;
  EXPECT_EQ(s.line.find('\n'), std::string::npos);
}

TEST(CudaRuntimeTest, ALibraryThatIsNotTheDriverIsSaidInOneLine) {
  DriverStatus s = driver_status("libm.so.6");
  EXPECT_EQ(s.state, State::no_driver);
  EXPECT_NE(s.line.find("has no cuInit"), std::string::npos) << s.line;
}

// The toolkit's stub libcuda, installed as libcuda.so.1: cuInit answers CUDA_ERROR_STUB_LIBRARY.
TEST(CudaRuntimeTest, TheToolkitsStubLibraryIsNamedAsSuch) {
  const fs::path stub = fs::path(cuda_home()) / "lib64/stubs/libcuda.so";
  if (!fs::exists(stub)) GTEST_SKIP() << "no CUDA toolkit stub library at " << stub << " (set CUDA_PATH)";
  const fs::path dir = fresh_dir("stub");
  fs::create_symlink(stub, dir / "libcuda.so.1");
  DriverStatus s = driver_status((dir / "libcuda.so.1").string());
  EXPECT_EQ(s.state, State::stub_library) << s.line;
  EXPECT_NE(s.line.find("stub"), std::string::npos) << s.line;
  try {
    Runner r(0, (dir / "libcuda.so.1").string());
    FAIL() << "a runner started on the stub library";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot run on a GPU: " + s.line);
  }
  fs::remove_all(dir);
}

// This machine's own driver: ready, or a runner refuses with the status line.
TEST(CudaRuntimeTest, ARunnerWithoutAReadyDriverIsAUserError) {
  DriverStatus s = driver_status();
  std::cout << "this machine: " << s.line << "\n";
  if (s.state == State::ready) GTEST_SKIP() << "this machine has a GPU: " << s.line;
  EXPECT_THROW(Runner(), UserError);
}

KernelBundle example() {
  KernelBundle b;
  b.target = "sm_90";
  b.ptx = ".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k1(.param .u64 p) { ret; }\n"
          ".visible .entry k2(.param .u64 p, .param .u64 q) { ret; }\n";
  b.buffers = {{"X", BundleBuffer::Role::input, {DType::f32, {4, 5}}},
               {"S", BundleBuffer::Role::scratch, {DType::i32, {}}},
               {"Y", BundleBuffer::Role::output, {DType::f64, {0, 3}}}};
  BundleKernel k1;
  k1.name = "k1";
  k1.grid = {3, 2, 1};
  k1.block = {32, 4, 2};
  k1.shared_bytes = 4096;
  k1.args = {"S"};
  BundleKernel k2;
  k2.name = "k2";
  k2.args = {"Y", "X"};
  b.kernels = {k1, k2};
  return b;
}

TEST(CudaRuntimeTest, BundlesAreWrittenAsAReadableManifestAndReadBack) {
  KernelBundle b = example();
  EXPECT_EQ(b.manifest(),
            "polytile kernel bundle 1\n"
            "target sm_90\n"
            "buffer X input f32 4x5\n"
            "buffer S scratch i32 scalar\n"
            "buffer Y output f64 0x3\n"
            "kernel k1 grid 3 2 1 block 32 4 2 shared 4096 args S\n"
            "kernel k2 grid 1 1 1 block 1 1 1 shared 0 args Y X\n");
  const fs::path dir = fresh_dir("bundle");
  b.write((dir / "b").string());
  KernelBundle again = KernelBundle::read((dir / "b").string());
  EXPECT_EQ(again.manifest(), b.manifest());
  EXPECT_EQ(again.ptx, b.ptx);
  fs::remove_all(dir);
  // The test bundle in the source tree parses too.
  KernelBundle add = KernelBundle::read(kBundle);
  ASSERT_EQ(add.kernels.size(), 1u);
  EXPECT_EQ(add.kernels[0].args, (std::vector<std::string>{"O", "A", "B"}));
}

TEST(CudaRuntimeTest, MalformedManifestsAreUserErrorsWithTheirLine) {
  const std::string ptx = example().ptx;
  const std::string head = "polytile kernel bundle 1\ntarget sm_90\nbuffer X input f32 4x5\n";
  const std::pair<std::string, std::string> cases[] = {
      {"a kernel bundle\n", "m.txt:1: not a kernel bundle manifest"},
      {"polytile kernel bundle 1\ntarget gfx90a\n", "m.txt:2: target 'gfx90a' is not sm_XY"},
      {head + "colour blue\n", "m.txt:4: unknown field 'colour'"},
      {head + "buffer X output f32 4\n", "m.txt:4: buffer X is declared twice"},
      {head + "buffer Y inout f32 4\n", "m.txt:4: buffer Y: role 'inout' is not input, output or scratch"},
      {head + "buffer Y input u8 4\n", "m.txt:4: buffer Y: unknown dtype 'u8'"},
      {head + "buffer Y input f32 4x-1\n", "m.txt:4: shape '4x-1' is not DIMxDIMx..."},
      {head + "kernel k1 grid 1 1 1 block 64 32 1 shared 0 args X\n", "m.txt:4: kernel k1 has more than 1024 threads per block"},
      {head + "kernel k1 grid 0 1 1 block 1 1 1 shared 0 args X\n", "m.txt:4: grid size must be an integer in [1, "},
      {head + "kernel k1 grid 1 1 1 block 1 1 1 shared 0 args Z\n", "m.txt:4: kernel k1 takes buffer Z, which is not declared above"},
      {head + "kernel k1 grid 1 1\n", "m.txt:4: expected: kernel NAME grid X Y Z block X Y Z shared BYTES args BUFFER..."},
      {head + "kernel k3 grid 1 1 1 block 1 1 1 shared 0 args X\n", "m.txt: kernel k3 has no .entry in the bundle's PTX"},
      {"polytile kernel bundle 1\nbuffer X input f32 4\n", "m.txt: no target line"},
      {head, "m.txt: no kernel"},
      {"", "m.txt: empty manifest"},
  };
  for (const auto& [manifest, message] : cases) {
    try {
      KernelBundle::parse(manifest, ptx, "m.txt");
      ADD_FAILURE() << "accepted:\n" << manifest;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(message, 0), 0u) << e.what() << "\nexpected: " << message;
    }
  }
  EXPECT_THROW(KernelBundle::read("/nonexistent/bundle"), UserError);
}

// What a run checks before it asks for a GPU: the inputs' names, dtypes and shapes, and buffers by role.
TEST(CudaRuntimeTest, InputsAndBuffersAreCheckedAgainstTheBundlesTable) {
  const KernelBundle b = KernelBundle::read(kBundle);
  const Buffer good(DType::f32, {1000});
  EXPECT_NO_THROW(b.check_inputs({{"A", good}, {"B", good}}));
  auto message = [&](const TensorMap& inputs) {
    try {
      b.check_inputs(inputs);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({{"A", good}}), "missing input B (f32[1000])");
  EXPECT_EQ(message({{"A", good}, {"B", good}, {"Z", good}}), "the bundle has no input Z");
  EXPECT_EQ(message({{"A", good}, {"B", good}, {"O", good}}), "the bundle has no input O (it is an output)");
  EXPECT_EQ(message({{"A", good}, {"B", Buffer(DType::f64, {1000})}}), "input B must be f32[1000], not f64[1000]");
  EXPECT_EQ(b.buffer("O", BundleBuffer::Role::output).type.shape, (std::vector<int64_t>{1000}));
  EXPECT_THROW(b.buffer("A", BundleBuffer::Role::output), UserError);
  EXPECT_EQ(b.find("Z"), nullptr);
  EXPECT_EQ(b.find("B"), &b.buffers[1]);
}

// The test bundle's hand-written PTX is valid for the targets we support (so a GPU run tests the runtime,
// not the kernel).
TEST(CudaRuntimeTest, TheTestBundlesPtxAssembles) {
  const fs::path ptxas = fs::path(cuda_home()) / "bin/ptxas";
  if (!fs::exists(ptxas)) GTEST_SKIP() << "no ptxas at " << ptxas << " (set CUDA_PATH)";
  for (const char* arch : {"sm_80", "sm_90"}) {
    std::string cmd = ptxas.string() + " -arch=" + arch + " " + kBundle + "/kernels.ptx -o /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

TEST(CudaRuntimeTest, TheTestBundleRunsOnAGpu) {
  DriverStatus s = driver_status();
  if (s.state != State::ready) GTEST_SKIP() << "no GPU to run on: " << s.line;
  KernelBundle b = KernelBundle::read(kBundle);
  Buffer a(DType::f32, {1000}), x(DType::f32, {1000});
  for (int64_t i = 0; i < 1000; ++i) {
    a.set(i, 0.25 * static_cast<double>(i) - 7);
    x.set(i, 1.0 / static_cast<double>(i + 1));
  }
  Runner runner;
  double ms = -1;
  TensorMap out = runner.run(b, {{"A", a}, {"B", x}}, &ms);
  ASSERT_EQ(out.count("O"), 1u);
  for (int64_t i = 0; i < 1000; ++i) {
    const float want = static_cast<float>(a.get(i)) + 2.0f * static_cast<float>(x.get(i));
    EXPECT_EQ(static_cast<float>(out.at("O").get(i)), want) << i;
  }
  EXPECT_GE(ms, 0.0);
  // Loaded once, launched many times: outputs poisoned with NaN before a launch are all written by it,
  // new inputs are used by the next launch, and a relaunch gives the same result.
  std::unique_ptr<LoadedBundle> loaded = runner.load(b);
  loaded->upload("A", a);
  loaded->upload("B", x);
  loaded->fill(0xff);
  EXPECT_TRUE(std::isnan(static_cast<float>(loaded->download("O").get(0))));
  EXPECT_GE(loaded->launch(), 0.0);
  Buffer first = loaded->download("O");
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(first.get(i), out.at("O").get(i)) << i;
  loaded->upload("B", a);
  loaded->fill(0xff);
  loaded->launch();
  Buffer second = loaded->download("O");
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(static_cast<float>(second.get(i)), static_cast<float>(a.get(i)) * 3.0f) << i;
  EXPECT_NE(loaded->device_address("A"), 0u);
  EXPECT_NE(loaded->device_address("A"), loaded->device_address("O"));
  EXPECT_THROW(loaded->upload("O", a), UserError);                           // an output, not an input
  EXPECT_THROW(loaded->upload("A", Buffer(DType::f32, {999})), UserError);  // wrong shape
  EXPECT_THROW(loaded->download("A"), UserError);                            // an input, not an output
  EXPECT_THROW(loaded->device_address("Z"), UserError);
  // What a user can get wrong is a one-line UserError.
  EXPECT_THROW(runner.run(b, {{"A", a}}, nullptr), UserError);                                  // missing input
  EXPECT_THROW(runner.run(b, {{"A", a}, {"B", Buffer(DType::f32, {999})}}, nullptr), UserError);  // wrong shape
  KernelBundle newer = b;
  newer.target = "sm_999";
  EXPECT_THROW(runner.run(newer, {{"A", a}, {"B", x}}, nullptr), UserError);
  KernelBundle broken = b;
  broken.ptx = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry add_twice(.param .u64 o) { bogus; }\n";
  try {
    runner.run(broken, {{"A", a}, {"B", x}}, nullptr);
    FAIL() << "the JIT accepted broken PTX";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("JIT rejected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace polytile::cuda
