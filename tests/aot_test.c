/* Ahead-of-time export from C: three programs compiled by `polytile compile --target cpu` into objects,
 * linked into this program with nothing but libm and pthreads, run serially (the entry point allocates its
 * workspace) and with a pthreads parallel_for (the caller's workspace), and checked against plain C loops. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "conv_grad.h"
#include "matmul_exp_max.h"

static int failures = 0;

#define EXPECT(cond, ...)                          \
  do {                                             \
    if (!(cond)) {                                 \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                \
      fprintf(stderr, "\n");                       \
      ++failures;                                  \
    }                                              \
  } while (0)

static uint64_t state = 42;
static float next_uniform(void) { /* in [-1, 1) */
  state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(state >> 40) / (double)(1 << 23) - 1.0);
}
static float* random_tensor(size_t n) {
  float* t = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) t[i] = next_uniform();
  return t;
}
static float* nan_tensor(size_t n) { /* every element an output must overwrite */
  float* t = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) t[i] = NAN;
  return t;
}
static void expect_close(const char* what, const float* got, const double* want, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (!(fabs(got[i] - want[i]) <= 1e-4 * (1 + fabs(want[i])))) {
      if (bad++ == 0) EXPECT(0, "%s[%zu] = %g, expected %g", what, i, got[i], want[i]);
    }
  EXPECT(bad == 0, "%s: %zu of %zu elements differ", what, bad, n);
}

/* A parallel_for on pthreads: [begin, end) in three parts, two on new threads and one on this one. */
static int parallel_calls = 0;
struct part {
  polytile_task task;
  void* closure;
  int64_t begin, end;
};
static void* run_part(void* p) {
  struct part* part = p;
  part->task(part->closure, part->begin, part->end);
  return NULL;
}
static void threads_for(void* user, int64_t begin, int64_t end, polytile_task task, void* closure) {
  int* calls = user;
  ++*calls;
  struct part parts[3];
  pthread_t threads[2];
  for (int i = 0; i < 3; ++i) {
    parts[i].task = task;
    parts[i].closure = closure;
    parts[i].begin = begin + (end - begin) * i / 3;
    parts[i].end = begin + (end - begin) * (i + 1) / 3;
  }
  for (int i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, run_part, &parts[i]);
  run_part(&parts[2]);
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
}

/* The seed's conv: O[n, y, x, co] = sum I[n, 3y + 2j, 3x + 2i, ci] * K[j, i, ci, co], and its input
 * gradient, by scattering (polytile's kernel gathers, after reduce and defract). */
enum { N = 3, H = 20, W = 23, CI = 5, KH = 2, KW = 2, CO = 7, OH = H / 3, OW = W / 3 };

/* Every term I[n, 3y + 2j, 3x + 2i, ci] * K[j, i, ci, co] of O[n, y, x, co], on an image of h x w pixels
 * (the terms whose pixel it holds): the forward gathers them into O (want[o] += image[p] * K[k]), the input
 * gradient scatters them into the image (want[p] += DO[o] * K[k]). */
static void conv_reference(int h, int w, int scatter, const float* a, const float* K, double* want) {
  for (int n = 0; n < N; ++n)
    for (int y = 0; y < OH; ++y)
      for (int x = 0; x < OW; ++x)
        for (int co = 0; co < CO; ++co)
          for (int j = 0; j < KH; ++j)
            for (int i = 0; i < KW; ++i)
              for (int ci = 0; ci < CI; ++ci) {
                if (3 * y + 2 * j >= h || 3 * x + 2 * i >= w) continue;
                const size_t o = ((n * OH + y) * OW + x) * CO + co, p = ((n * h + 3 * y + 2 * j) * w + 3 * x + 2 * i) * CI + ci,
                             k = ((j * KW + i) * CI + ci) * CO + co;
                if (scatter) want[p] += (double)a[o] * K[k];
                else want[o] += (double)a[p] * K[k];
              }
}

static void test_conv(void) {
  float* I = random_tensor(N * H * W * CI);
  float* K = random_tensor(KH * KW * CI * CO);
  double* want = calloc(N * OH * OW * CO, sizeof(double));
  conv_reference(H, W, 0, I, K, want);
  float* O = nan_tensor(N * OH * OW * CO);
  EXPECT(conv(I, K, O, NULL, NULL, NULL) == 0, "conv failed");
  expect_close("conv O (serial)", O, want, N * OH * OW * CO);
  free(O);
  O = nan_tensor(N * OH * OW * CO);
  parallel_calls = 0;
  EXPECT(conv(I, K, O, NULL, threads_for, &parallel_calls) == 0, "conv failed");
  EXPECT(parallel_calls > 0, "conv never called parallel_for");
  expect_close("conv O (threads)", O, want, N * OH * OW * CO);
  free(O);
  free(want);
  free(I);
  free(K);
}

static void test_conv_grad(void) {
  enum { DH = 3 * OH, DW = 3 * OW };
  float* DO = random_tensor(N * OH * OW * CO);
  float* K = random_tensor(KH * KW * CI * CO);
  double* want = calloc(N * DH * DW * CI, sizeof(double));
  conv_reference(DH, DW, 1, DO, K, want);
  for (int threaded = 0; threaded < 2; ++threaded) {
    float* DI = nan_tensor(N * DH * DW * CI);
    EXPECT(conv_grad(DO, K, DI, NULL, threaded ? threads_for : NULL, &parallel_calls) == 0, "conv_grad failed");
    expect_close(threaded ? "conv_grad DI (threads)" : "conv_grad DI (serial)", DI, want, N * DH * DW * CI);
    free(DI);
  }
  free(want);
  free(DO);
  free(K);
}

static void test_matmul_exp_max(void) {
  enum { M = 37, KK = 19, NN = 23 };
  float* A = random_tensor(M * KK);
  float* B = random_tensor(KK * NN);
  double C[M * NN], E[M * NN], T[NN], Bd[KK * NN];
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < NN; ++n) {
      double s = 0;
      for (int k = 0; k < KK; ++k) s += (double)A[m * KK + k] * B[k * NN + n];
      C[m * NN + n] = s;
      E[m * NN + n] = exp(s);
    }
  for (int n = 0; n < NN; ++n) {
    T[n] = -INFINITY;
    for (int m = 0; m < M; ++m) T[n] = fmax(T[n], C[m * NN + n]);
  }
  for (int i = 0; i < KK * NN; ++i) Bd[i] = B[i];
  EXPECT(MATMUL_EXP_MAX_WORKSPACE_BYTES >= M * NN * (int)sizeof(float), "the workspace (%d bytes) cannot hold C",
         MATMUL_EXP_MAX_WORKSPACE_BYTES);
  for (int mode = 0; mode < 3; ++mode) {
    /* mode 0: the entry point allocates its workspace; mode 1: the caller's (poisoned first), with threads;
     * mode 2: the arguments as an array (matmul_exp_max_argv) */
    void* workspace = NULL;
    if (mode == 1) {
      workspace = aligned_alloc(64, (MATMUL_EXP_MAX_WORKSPACE_BYTES + 63) / 64 * 64);
      memset(workspace, 0xff, MATMUL_EXP_MAX_WORKSPACE_BYTES);
    }
    float* Eo = nan_tensor(M * NN);
    float* To = nan_tensor(NN);
    float* Bo = nan_tensor(KK * NN);
    if (mode < 2) {
      EXPECT(matmul_exp_max(A, B, Eo, To, Bo, workspace, mode ? threads_for : NULL, &parallel_calls) == 0, "failed");
    } else {
      void* const arguments[] = {A, B, Eo, To, Bo};
      EXPECT(matmul_exp_max_argv(arguments, NULL, threads_for, &parallel_calls) == 0, "failed");
    }
    const char* how[] = {"serial", "threads", "argv"};
    char what[64];
    snprintf(what, sizeof what, "E (%s)", how[mode]);
    expect_close(what, Eo, E, M * NN);
    snprintf(what, sizeof what, "T (%s)", how[mode]);
    expect_close(what, To, T, NN);
    snprintf(what, sizeof what, "B passed through (%s)", how[mode]);
    expect_close(what, Bo, Bd, KK * NN);
    free(Eo);
    free(To);
    free(Bo);
    free(workspace);
  }
  free(A);
  free(B);
}

int main(void) {
  test_conv();
  test_conv_grad();
  test_matmul_exp_max();
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ahead-of-time objects: all values match\n");
  return 0;
}
