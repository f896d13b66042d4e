/* The C API driven from C (this file is compiled as C): parse, inspect, differentiate, compile and run on
 * the caller's arrays, checked against loops written here; and the errors a C caller can make. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "polytile/polytile.h"

static int failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              polytile_last_error());                                                \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

enum { M = 3, K = 4, N = 5 };

int main(void) {
  CHECK(strcmp(polytile_version(), POLYTILE_VERSION_FOR_TESTS) == 0);

  /* A layer: Y = relu(A B). */
  polytile_program* layer = NULL;
  CHECK(polytile_parse("function (A[M, K], B[K, N]) -> (Y) { C[i, j : M, N] = +(A[i, k] * B[k, j]); Y = relu(C); }",
                       &layer) == POLYTILE_OK);
  CHECK(polytile_program_input_count(layer) == 2);
  CHECK(strcmp(polytile_program_input(layer, 1), "B") == 0);
  CHECK(polytile_program_output_count(layer) == 1 && strcmp(polytile_program_output(layer, 0), "Y") == 0);
  CHECK(strstr(polytile_program_text(layer), "Y = relu(C);") != NULL);

  float a[M * K], b[K * N], y[M * N], want[M * N];
  for (int i = 0; i < M * K; ++i) a[i] = (float)(i % 5) - 2.0f;
  for (int i = 0; i < K * N; ++i) b[i] = 0.5f * (float)(i % 3) - 0.25f;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = 0;
      for (int k = 0; k < K; ++k) s += a[i * K + k] * b[k * N + j];
      want[i * N + j] = s > 0 ? s : 0;
    }
  const int64_t a_shape[] = {M, K}, b_shape[] = {K, N}, y_shape[] = {M, N};
  polytile_tensor inputs[] = {{"A", a, POLYTILE_F32, 2, a_shape}, {"B", b, POLYTILE_F32, 2, b_shape}};
  polytile_tensor outputs[] = {{"Y", y, POLYTILE_F32, 2, y_shape}};
  CHECK(polytile_check(layer, inputs, 2) == POLYTILE_OK);
  const int64_t mismatched[] = {K + 1, N};
  polytile_tensor mismatch[] = {{"A", a, POLYTILE_F32, 2, a_shape}, {"B", b, POLYTILE_F32, 2, mismatched}};
  CHECK(polytile_check(layer, mismatch, 2) == POLYTILE_USER_ERROR && strstr(polytile_last_error(), "K") != NULL);
  polytile_compiled* compiled = NULL;
  CHECK(polytile_compile(layer, inputs, 2, "cpu", &compiled) == POLYTILE_OK);
  polytile_dtype dtype = POLYTILE_I32;
  int rank = -1;
  const int64_t* shape = NULL;
  CHECK(polytile_output_type(compiled, "Y", &dtype, &rank, &shape) == POLYTILE_OK);
  CHECK(dtype == POLYTILE_F32 && rank == 2 && shape && shape[0] == M && shape[1] == N);
  memset(y, 0xff, sizeof y);
  CHECK(polytile_run(compiled, inputs, 2, outputs, 1) == POLYTILE_OK);
  for (int i = 0; i < M * N; ++i) CHECK(fabsf(y[i] - want[i]) <= 1e-5f);

  /* Its gradient with respect to A: DA = (DY * [C > 0]) B^T. */
  polytile_program* grad = NULL;
  const char* wrt[] = {"A"};
  CHECK(polytile_gradient(layer, wrt, 1, &grad) == POLYTILE_OK);
  CHECK(polytile_program_output_count(grad) == 1 && strcmp(polytile_program_output(grad, 0), "DA") == 0);
  float dy[M * N], da[M * K], da_want[M * K];
  for (int i = 0; i < M * N; ++i) dy[i] = 1.0f + (float)(i % 4);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) {
      float s = 0;
      for (int j = 0; j < N; ++j) s += (want[i * N + j] > 0 ? dy[i * N + j] : 0) * b[k * N + j];
      da_want[i * K + k] = s;
    }
  const int64_t da_shape[] = {M, K};
  polytile_tensor grad_inputs[] = {{"A", a, POLYTILE_F32, 2, a_shape}, {"B", b, POLYTILE_F32, 2, b_shape},
                                   {"DY", dy, POLYTILE_F32, 2, y_shape}};
  polytile_tensor grad_outputs[] = {{"DA", da, POLYTILE_F32, 2, da_shape}};
  polytile_compiled* grad_compiled = NULL;
  CHECK(polytile_compile(grad, grad_inputs, 3, NULL, &grad_compiled) == POLYTILE_OK);
  CHECK(polytile_run(grad_compiled, grad_inputs, 3, grad_outputs, 1) == POLYTILE_OK);
  for (int i = 0; i < M * K; ++i) CHECK(fabsf(da[i] - da_want[i]) <= 1e-4f);

  /* int64_t arrays: exact beyond 2^53, wrapping like unsigned arithmetic. */
  polytile_program* scale = NULL;
  CHECK(polytile_parse("function (X[L]) -> (Z) { Z = X * 3 + 1; }", &scale) == POLYTILE_OK);
  int64_t x[4] = {((int64_t)1 << 62) + 3, INT64_MIN, ((int64_t)1 << 53) + 1, -7}, z[4];
  const int64_t x_shape[] = {4};
  polytile_tensor x_in[] = {{"X", x, POLYTILE_I64, 1, x_shape}}, z_out[] = {{"Z", z, POLYTILE_I64, 1, x_shape}};
  polytile_compiled* scale_compiled = NULL;
  CHECK(polytile_compile(scale, x_in, 1, "cpu", &scale_compiled) == POLYTILE_OK);
  CHECK(polytile_output_type(scale_compiled, "Z", &dtype, &rank, &shape) == POLYTILE_OK && dtype == POLYTILE_I64);
  CHECK(polytile_run(scale_compiled, x_in, 1, z_out, 1) == POLYTILE_OK);
  for (int i = 0; i < 4; ++i) CHECK(z[i] == (int64_t)((uint64_t)x[i] * 3u + 1u));
  polytile_compiled_free(scale_compiled);
  polytile_program_free(scale);

  /* Errors: a status, a one-line message, no crash. */
  polytile_program* bad = NULL;
  CHECK(polytile_parse("function (A[N]) -> (B) { B = A +; }", &bad) == POLYTILE_USER_ERROR && bad == NULL);
  CHECK(strstr(polytile_last_error(), "1:") != NULL);
  CHECK(polytile_parse_file("/nonexistent/program.tile", &bad) == POLYTILE_USER_ERROR);
  CHECK(polytile_parse(NULL, &bad) == POLYTILE_USER_ERROR);
  const int64_t wrong_shape[] = {K, M};
  polytile_tensor wrong[] = {{"A", a, POLYTILE_F32, 2, wrong_shape}, {"B", b, POLYTILE_F32, 2, b_shape}};
  CHECK(polytile_run(compiled, wrong, 2, outputs, 1) == POLYTILE_USER_ERROR);
  CHECK(strstr(polytile_last_error(), "input A") != NULL);
  polytile_tensor overlapping[] = {{"Y", a, POLYTILE_F32, 2, y_shape}};
  CHECK(polytile_run(compiled, inputs, 2, overlapping, 1) == POLYTILE_USER_ERROR);
  CHECK(polytile_run(NULL, inputs, 2, outputs, 1) == POLYTILE_USER_ERROR);
  polytile_compiled* nothing = NULL;
  CHECK(polytile_compile(layer, inputs, 2, "sm_90", &nothing) == POLYTILE_USER_ERROR && nothing == NULL);
  /* The code for another CPU: SSE4.2 (x86-64-v2), which every x86-64 machine of the last decade runs. */
  polytile_compiled* sse = NULL;
  CHECK(polytile_compile(layer, inputs, 2, "cpu:x86-64-v2", &sse) == POLYTILE_OK);
  memset(y, 0xff, sizeof y);
  CHECK(polytile_run(sse, inputs, 2, outputs, 1) == POLYTILE_OK);
  for (int i = 0; i < M * N; ++i) CHECK(fabsf(y[i] - want[i]) <= 1e-5f);
  polytile_compiled_free(sse);
  CHECK(polytile_compile(layer, inputs, 2, "cpu:pentium-9000", &nothing) == POLYTILE_USER_ERROR && nothing == NULL);
  CHECK(strstr(polytile_last_error(), "unknown CPU 'pentium-9000'") != NULL);
  polytile_tensor bad_dtype[] = {{"A", a, 7, 2, a_shape}, {"B", b, POLYTILE_F32, 2, b_shape}};
  CHECK(polytile_compile(layer, bad_dtype, 2, "cpu", &nothing) == POLYTILE_USER_ERROR);
  CHECK(polytile_compile(layer, inputs, 1, "cpu", &nothing) == POLYTILE_USER_ERROR); /* B missing */
  CHECK(strstr(polytile_last_error(), "B") != NULL);
  CHECK(polytile_output_type(compiled, "Z", &dtype, &rank, &shape) == POLYTILE_USER_ERROR);
  /* A success clears the last error. */
  CHECK(polytile_run(compiled, inputs, 2, outputs, 1) == POLYTILE_OK && polytile_last_error()[0] == '\0');

  polytile_compiled_free(grad_compiled);
  polytile_compiled_free(compiled);
  polytile_program_free(grad);
  polytile_program_free(layer);
  polytile_program_free(NULL);
  if (failures) fprintf(stderr, "%d checks failed\n", failures);
  else printf("C API: all checks passed\n");
  return failures != 0;
}
