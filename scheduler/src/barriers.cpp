// check_barriers (scheduler.h): the synchronization of a kernel's shared tiles, checked on its loop IR by
// walking every path through the code a block runs. The state is what happened since the last barrier:
// tiles written (copies) and tiles read (thread code of an update that reads shared tiles). A copy meets a
// tile read or written since the barrier, or thread code meets a tile written since it: a race on the GPU
// (the host, running threads one after another, would not see it). A loop's body is walked twice, so
// that the end of one iteration meets the start of the next (a loop mapped to blocks once: each block
// has tiles of its own); a guard's branches are walked from the same state and joined.
#include <algorithm>
#include <set>
#include <string>

#include "polytile/error.h"
#include "polytile/scheduler.h"

namespace polytile::sched {

int64_t SharedTile::elements() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t SharedTile::storage() const {
  if (sizes.empty()) return 1;
  return elements() / sizes.back() * std::max(pitch, sizes.back());
}

namespace {

struct Since {
  std::set<int> written, read;
  void join(const Since& o) {
    written.insert(o.written.begin(), o.written.end());
    read.insert(o.read.begin(), o.read.end());
  }
};

class BarrierCheck {
 public:
  explicit BarrierCheck(const Nest& nest) : nest_(nest) {}

  void walk(const LoopNode& n, Since& s) {
    using K = LoopNode::Kind;
    switch (n.kind) {
      case K::block:
        for (const LoopNode& c : n.body) walk(c, s);
        return;
      case K::barrier:
        s = Since{};
        return;
      case K::guard: {
        Since other = s;
        for (const LoopNode& c : n.body) walk(c, s);
        for (const LoopNode& c : n.otherwise) walk(c, other);
        s.join(other);
        return;
      }
      case K::loop:
        if (n.hardware == LoopNode::Hardware::thread) {
          threads(n, s);
          return;
        }
      {
        if (n.hardware == LoopNode::Hardware::block) {  // one iteration per block, each with its own tiles
          for (const LoopNode& c : n.body) walk(c, s);
          return;
        }
        const Since before = s;  // the loop may not run at all
        for (int pass = 0; pass < 2; ++pass)
          for (const LoopNode& c : n.body) walk(c, s);
        s.join(before);
        return;
      }
      case K::statement:
        if (n.statement == LoopNode::Statement::copy) {
          if (s.read.count(n.tile) || s.written.count(n.tile))
            fail("shared tile " + tile(n.tile) + " is copied while threads may still read it (no barrier since)");
          s.written.insert(n.tile);
          return;
        }
        threads(n, s);
        return;
    }
  }

 private:
  // Code that each thread runs on its own: it reads every shared tile (the update reads them all).
  void threads(const LoopNode& n, Since& s) {
    inside(n);
    if (nest_.kind != Nest::Kind::update) return;
    for (int t = 0; t < static_cast<int>(nest_.shared.size()); ++t) {
      if (s.written.count(t)) fail("shared tile " + tile(t) + " is read with no barrier after its copy");
      s.read.insert(t);
    }
  }

  // No barrier or copy where threads run on their own.
  void inside(const LoopNode& n) {
    if (n.kind == LoopNode::Kind::barrier) fail("a barrier inside code mapped to threads");
    if (n.kind == LoopNode::Kind::statement && n.statement == LoopNode::Statement::copy)
      fail("a copy of shared tile " + tile(n.tile) + " inside code mapped to threads");
    for (const LoopNode& c : n.body) inside(c);
    for (const LoopNode& c : n.otherwise) inside(c);
  }

  std::string tile(int t) const {
    POLYTILE_CHECK(t >= 0 && t < static_cast<int>(nest_.shared.size()), "kernel ", nest_.name, ": copy of no shared tile (", t, ")");
    return std::to_string(t) + " (" + nest_.shared[static_cast<size_t>(t)].tensor + ")";
  }

  [[noreturn]] void fail(const std::string& what) const { throw InternalError("kernel " + nest_.name + ": " + what); }

  const Nest& nest_;
};

}  // namespace

void check_barriers(const Nest& nest) {
  if (!nest.kernel) return;
  Since s;
  BarrierCheck check(nest);
  check.walk(nest.root, s);
}

}  // namespace polytile::sched
