// Private: LLVM IR for the nests of a schedule (the shared emitter; see emitter.cpp).
#pragma once

#include <llvm/IR/Module.h>

#include <map>
#include <string>
#include <vector>

#include "polytile/scheduler.h"
#include "polytile/shapes.h"

namespace polytile::cpu {

// Adds `void nest_<k>(ptr buffers, i64 lo, i64 hi)` for every nest k; buffers[buffer_index[t]] holds
// tensor t.
// The tensors a nest's code reads or writes (its buffers).
std::vector<std::string> nest_tensors(const sched::Nest& nest);

void emit_nests(llvm::Module& module, const sched::Schedule& schedule, const ProgramTypes& types,
                const std::map<std::string, int>& buffer_index);

}  // namespace polytile::cpu
