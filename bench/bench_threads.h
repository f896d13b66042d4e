// The threads every CPU bench case runs on, polytile and peers alike: $POLYTILE_BENCH_THREADS, else 2.
#pragma once

#include <cstdlib>

inline int bench_threads() {
  const char* t = std::getenv("POLYTILE_BENCH_THREADS");
  return t ? std::atoi(t) : 2;
}
