// .npy reading and writing: round trips for every dtype, numpy's own header bytes, and bad files.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <limits>

#include <unistd.h>

#include "polytile/error.h"
#include "polytile/npy.h"

namespace polytile {
namespace {

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  for (DType t : kDTypes) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {3}, {2, 3}, {1, 2, 3}, {3, 0, 2}}) {  // {3, 0, 2}: no storage
      Buffer b(t, shape);
      for (int64_t i = 0; i < b.size(); ++i) b.set(i, (i % 3) - 1.25 * is_float(t));
      Buffer r = parse_npy(format_npy(b), "mem");
      EXPECT_EQ(r.dtype(), t);
      EXPECT_EQ(r.shape(), shape);
      EXPECT_EQ(r.to_doubles(), b.to_doubles());
    }
  }
}

TEST(NpyTest, ReadsNumpysHeaderLayout) {
  // Bytes as numpy 1.x writes np.arange(6, dtype='<f4').reshape(2, 3).
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(118 - header.size() - 1, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(118) + '\0' + header;
  for (float v : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) bytes.append(reinterpret_cast<const char*>(&v), 4);
  Buffer b = parse_npy(bytes, "arange.npy");
  EXPECT_EQ(b.type_str(), "f32[2, 3]");
  EXPECT_EQ(b.get(5), 5.0);
  // The header we write is 64-byte aligned, as numpy requires.
  EXPECT_EQ((format_npy(b).size() - 24) % 64, 0u);
}

TEST(NpyTest, FileRoundTrip) {
  std::string path = ::testing::TempDir() + "/polytile_npy_test_" + std::to_string(::getpid()) + ".npy";
  Buffer b = Buffer::from_values(DType::f64, {2}, {1.5, -2});
  write_npy(path, b);
  EXPECT_EQ(read_npy(path).to_doubles(), b.to_doubles());
  std::remove(path.c_str());
}

TEST(NpyTest, BadFilesAreUserErrorsNamingTheFile) {
  auto error_of = [](const std::string& bytes) {
    try {
      parse_npy(bytes, "bad.npy");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Buffer b = Buffer::from_values(DType::f32, {2}, {1, 2});
  std::string good = format_npy(b);
  EXPECT_NE(error_of("hello").find("bad.npy is not a .npy file"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, good.size() - 1)).find("bad.npy is truncated"), std::string::npos);
  std::string i8 = good;
  i8.replace(i8.find("<f4"), 3, "<u2");
  EXPECT_NE(error_of(i8).find("unsupported dtype '<u2'"), std::string::npos);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_NE(error_of(fortran).find("Fortran-ordered"), std::string::npos);
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_NE(error_of(big_endian).find("unsupported dtype '>f4'"), std::string::npos);
  // A header may claim any shape: the data is checked before anything is allocated.
  std::string lying = good;
  lying.replace(lying.find("(2,)"), 4, "(99999999999,)");
  EXPECT_NE(error_of(lying).find("its header claims shape (99999999999) of f32 but only"), std::string::npos)
      << error_of(lying);
  std::string huge = good;
  huge.replace(huge.find("(2,)"), 4, "(4294967296, 4294967296, 4294967296)");
  EXPECT_NE(error_of(huge).find("is truncated"), std::string::npos) << error_of(huge);
  std::string no_shape = good;
  no_shape.replace(no_shape.find("(2,)"), 4, "    ");
  EXPECT_NE(error_of(no_shape).find("malformed shape"), std::string::npos) << error_of(no_shape);
  EXPECT_THROW(read_npy("/nonexistent/in.npy"), UserError);
  EXPECT_THROW(write_npy("/nonexistent/dir/out.npy", b), UserError);
}

// A buffer's data starts on a cache line, whatever its size and dtype, and so does a copy's: the compiled
// kernels' 64-byte vector loads of a buffer (a packed panel, a row of an output) then never straddle two
// lines. Values survive the copy.
TEST(BufferTest, DataIsCacheLineAligned) {
  for (DType t : kDTypes)
    for (int64_t n : {1, 3, 17, 1000, 1 << 20}) {
      Buffer b(t, {n});
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << b.type_str();
      b.set(n - 1, 1);
      Buffer copy = b;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % 64, 0u) << copy.type_str();
      EXPECT_EQ(copy.get(n - 1), 1.0) << copy.type_str();
    }
}

// A buffer of 2 MiB or more starts on a 2 MiB boundary and, where the kernel's transparent huge pages
// are on ("always" or "madvise" in /sys/kernel/mm/transparent_hugepage/enabled), its memory is eligible
// for them (/proc/self/smaps says THPeligible: 1 for its mapping: in "madvise" mode only memory advised
// with MADV_HUGEPAGE is); smaller buffers keep 64-byte alignment only. Whether the kernel then backs the
// memory with huge pages is its choice (free contiguous memory), so the test does not ask.
TEST(BufferTest, LargeBuffersAreAdvisedForHugePages) {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string mode((std::istreambuf_iterator<char>(mode_file)), std::istreambuf_iterator<char>());
  const bool thp = !mode.empty() && mode.find("[never]") == std::string::npos;
  if (!thp) std::cout << "transparent huge pages are off here: only the alignment is checked\n";
  for (int64_t n : {int64_t{1} << 19, (int64_t{3} << 20) + 5}) {  // 2 MiB and 12 MiB + 20 bytes of f32
    Buffer b(DType::f32, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (uintptr_t{2} << 20), 0u) << b.type_str();
    Buffer copy = b;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % (uintptr_t{2} << 20), 0u) << copy.type_str();
    if (!thp) continue;
    // The mapping that holds the buffer's first byte, and its THPeligible line.
    const uintptr_t at = reinterpret_cast<uintptr_t>(b.data());
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    int eligible = -1;
    while (std::getline(smaps, line)) {
      uintptr_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line: its address range
        inside = lo <= at && at < hi;
        continue;
      }
      if (inside && line.rfind("THPeligible:", 0) == 0) eligible = std::atoi(line.c_str() + 12);
    }
    EXPECT_EQ(eligible, 1) << b.type_str() << " at " << b.data();
  }
  Buffer small(DType::f32, {1000});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
}

// difference(): how far a result is from what was expected, as polytile-run-bundle --expect and the GPU
// benchmark's check read it.
TEST(BufferTest, DifferenceIsTheRelativeNormAndCountsUnexpectedNan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Buffer want = Buffer::from_values(DType::f64, {4}, {3, 0, 4, nan});
  Difference same = difference(want, want);
  EXPECT_EQ(same.relative, 0.0);
  EXPECT_EQ(same.unexpected_nan, 0);
  EXPECT_TRUE(same.within(0));
  // Off by 0.5 in one element: ||(0.5, 0, 0)|| / ||(3, 0, 4)|| = 0.1; the NaN that want has is skipped.
  Difference off = difference(Buffer::from_values(DType::f64, {4}, {3.5, 0, 4, 1}), want);
  EXPECT_DOUBLE_EQ(off.relative, 0.1);
  EXPECT_EQ(off.unexpected_nan, 0);
  EXPECT_TRUE(off.within(0.1));
  EXPECT_FALSE(off.within(0.09));
  // NaN where want has a value: an element nothing wrote.
  Difference unwritten = difference(Buffer::from_values(DType::f64, {4}, {nan, 0, 4, nan}), want);
  EXPECT_EQ(unwritten.unexpected_nan, 1);
  EXPECT_FALSE(unwritten.within(1e9));
  // All-zero expectation: the plain norm of the difference.
  EXPECT_DOUBLE_EQ(difference(Buffer::from_values(DType::f32, {2}, {3, 4}), Buffer(DType::f32, {2})).relative, 5.0);
  // Integers and bools must be equal.
  Buffer ints = Buffer::from_values(DType::i32, {3}, {1, 2, 3});
  EXPECT_EQ(difference(ints, ints).relative, 0.0);
  EXPECT_EQ(difference(Buffer::from_values(DType::i32, {3}, {1, 2, 4}), ints).relative, 1.0);
}

}  // namespace
}  // namespace polytile
