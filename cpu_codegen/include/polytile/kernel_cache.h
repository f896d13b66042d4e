// A persistent cache of compiled programs on disk, so that a second process (a second `polytile run`)
// skips compilation. An entry is what ahead-of-time export makes (cpu::export_object: an object file with
// one C entry point and its argument table), keyed by the program's normalized text, the input types, the
// target (this machine's CPU and features, the CPU model, threads), the options and the compiler that made
// it (compiler_identity: a digest of polytile's sources, LLVM's and isl's versions).
// A hit loads the object into this process with LLVM's ORC linker: no lowering, scheduling or code
// generation. One file per entry, written to a temporary file and renamed into place (concurrent processes
// see a whole entry or none); each holds its full key and a checksum, so a truncated, corrupted or foreign
// file is detected, removed and the program compiled again, never run. Least recently used entries are
// removed past the size limit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "polytile/cpu.h"

namespace polytile::cpu {

// An exported object loaded into this process, run like CompiledProgram::run on polytile's buffers.
// Concurrent runs are safe: each takes a workspace of its own.
class LoadedProgram {
 public:
  ~LoadedProgram();
  // Runs on inputs of exactly the compiled types (UserError naming the input otherwise); `threads` (0:
  // the machine's; at most 1024, a UserError otherwise) run the parallel loops through TBB.
  TensorMap run(const TensorMap& inputs, int threads = 0) const;
  // The same, writing into `outputs`: an output buffer already there with the compiled dtype and shape is
  // overwritten in place (the way to run in a loop: no allocation, and no page faults on fresh memory at
  // every run); other outputs are allocated and added.
  void run(const TensorMap& inputs, TensorMap& outputs, int threads = 0) const;
  const ExportedObject& exported() const;

  struct Impl;
  explicit LoadedProgram(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// What compiles here, as part of every cache key: polytile's version, a digest of the sources of the
// stages that shape the generated code (tile, lattice, polyhedral, autodiff, scheduler, llvm_ir,
// cpu_codegen) as built, and the LLVM and isl versions it runs with, e.g.
// "polytile 0.1.0, sources c8bf2ddedc64df02, LLVM 16.0.6, isl-0.25-GMP". Any change to the compiler makes
// new keys, so entries an older build made (with its bugs) are never loaded by a newer one.
std::string compiler_identity();

// Links `exported` into this process (it must have been made on this machine's CPU).
std::shared_ptr<const LoadedProgram> load(ExportedObject exported);

class KernelCache {
 public:
  // $POLYTILE_CACHE_DIR if set, else $XDG_CACHE_HOME/polytile, else $HOME/.cache/polytile; "" when none
  // of them is set (no cache).
  static std::string default_directory();
  // The directory is created on the first store. UserError for an empty directory.
  explicit KernelCache(std::string directory = default_directory(), uint64_t limit_bytes = uint64_t{256} << 20);

  struct Result {
    std::shared_ptr<const LoadedProgram> program;
    bool hit = false;
    std::string dropped;     // why an entry that was there was not used ("" when none was), e.g. "truncated"
    std::string not_stored;  // why a compiled program could not be stored ("" when it was or was found)
    double seconds = 0;   // loading (a hit) or compiling, storing and loading (a miss)
  };
  // The program compiled for `inputs`: loaded from the cache, or compiled (export_object), stored and
  // loaded. UserError for what compile() refuses, a GPU target or tuning (the cache holds untuned code).
  Result get(const Program& program, const std::map<std::string, TensorType>& inputs, const CompileOptions& options = {});

  struct Info {
    std::string directory;
    size_t entries = 0;
    uint64_t bytes = 0, limit_bytes = 0;
  };
  Info info() const;
  // Removes every entry (and temporary files that crashed writers left); returns how many entries.
  size_t clear();

  const std::string& directory() const { return directory_; }

 private:
  void store(const std::filesystem::path& path, const std::string& bytes, std::string& why) const;
  void trim(const std::filesystem::path& keep) const;
  std::string directory_;
  uint64_t limit_bytes_;
};

}  // namespace polytile::cpu
