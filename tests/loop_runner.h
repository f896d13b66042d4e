// The loop IR that the scheduler hands to the code generators, run on integers (tests' oracle for
// loops built different ways: the statement instances they run, in order).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "polytile/scheduler.h"

namespace polytile::sched::testing_loops {

// The loop IR run on integers: `visit` gets every statement instance, in execution order, with the
// values of its arguments.
inline int64_t evaluate(const LoopExpr& e, const std::vector<int64_t>& it) {
  using K = LoopExpr::Kind;
  auto arg = [&](size_t k) { return evaluate(e.args[k], it); };
  switch (e.kind) {
    case K::constant: return e.value;
    case K::iterator: return it.at(static_cast<size_t>(e.iterator));
    case K::add: return arg(0) + arg(1);
    case K::sub: return arg(0) - arg(1);
    case K::mul: return arg(0) * arg(1);
    case K::floordiv: {
      int64_t x = arg(0), y = arg(1), q = x / y;
      return q * y != x && (x < 0) != (y < 0) ? q - 1 : q;
    }
    case K::mod: {
      int64_t y = arg(1), r = arg(0) % y;
      return r != 0 && (r < 0) != (y < 0) ? r + y : r;
    }
    case K::min:
    case K::max: {
      int64_t r = arg(0);
      for (size_t k = 1; k < e.args.size(); ++k) r = e.kind == K::min ? std::min(r, arg(k)) : std::max(r, arg(k));
      return r;
    }
    case K::neg: return -arg(0);
    case K::select: return arg(0) ? arg(1) : arg(2);
    case K::eq: return arg(0) == arg(1);
    case K::le: return arg(0) <= arg(1);
    case K::lt: return arg(0) < arg(1);
    case K::ge: return arg(0) >= arg(1);
    case K::gt: return arg(0) > arg(1);
    case K::land: return arg(0) && arg(1);
    case K::lor: return arg(0) || arg(1);
  }
  return 0;
}

// `hw`: in a GPU kernel, the block (x, y, z) and thread (x, y, z) indices of the thread that runs: a mapped
// loop runs its body once, with its iterator at its index, when that lies in the loop's range.
// A statement's instance: its arguments and, in kernels with accumulators, its accumulator's position.
using Visit = std::function<void(const LoopNode&, const std::vector<int64_t>& args, const std::vector<int64_t>& position)>;
// A register loop's iterator must stay in [0, unroll): the emitter runs it over that range.
inline void run_loops(const LoopNode& n, std::vector<int64_t>& it, const Visit& visit, const std::array<int64_t, 6>* hw = nullptr) {
  auto children = [&](const std::vector<LoopNode>& nodes) {
    for (const LoopNode& c : nodes) run_loops(c, it, visit, hw);
  };
  switch (n.kind) {
    case LoopNode::Kind::block:
      children(n.body);
      break;
    case LoopNode::Kind::loop: {
      const size_t i = static_cast<size_t>(n.iterator);
      if (n.hardware != LoopNode::Hardware::none) {
        ASSERT_NE(hw, nullptr) << "a mapped loop outside a kernel launch";
        int64_t v = (*hw)[static_cast<size_t>((n.hardware == LoopNode::Hardware::block ? 0 : 3) + n.axis)] / n.part_stride;
        if (n.part_extent > 0) v %= n.part_extent;
        it.at(i) = v;
        const int64_t lower = evaluate(n.lower, it);
        if (v >= lower && evaluate(n.condition, it) && (v - lower) % n.step == 0) children(n.body);
        break;
      }
      for (it.at(i) = evaluate(n.lower, it); evaluate(n.condition, it); it[i] += n.step) {
        if (n.unroll) {
          EXPECT_TRUE(it[i] >= 0 && it[i] < n.unroll) << "register loop c" << n.iterator << " at " << it[i];
        }
        children(n.body);
      }
      break;
    }
    case LoopNode::Kind::guard:
      children(evaluate(n.condition, it) ? n.body : n.otherwise);
      break;
    case LoopNode::Kind::barrier: break;
    case LoopNode::Kind::statement: {
      std::vector<int64_t> args, position;
      for (const LoopExpr& a : n.args) args.push_back(evaluate(a, it));
      for (const LoopExpr& a : n.registers) position.push_back(evaluate(a, it));
      visit(n, args, position);
      break;
    }
  }
}

}  // namespace polytile::sched::testing_loops
