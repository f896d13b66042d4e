// The threads every CPU bench case runs on, polytile and peers alike: $POLYTILE_BENCH_THREADS, else 2.
// And the CPU polytile's code is made for: $POLYTILE_BENCH_CPU (cpu::cpu_target's name), else "" (this one).
#pragma once

#include <cstdlib>

inline int bench_threads() {
  const char* t = std::getenv("POLYTILE_BENCH_THREADS");
  return t ? std::atoi(t) : 2;
}

inline const char* bench_cpu() {
  const char* cpu = std::getenv("POLYTILE_BENCH_CPU");
  return cpu ? cpu : "";
}
