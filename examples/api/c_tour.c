/* polytile from C: a dot product and its gradient, run on the caller's arrays. */
#include <polytile/polytile.h>
#include <stdio.h>

int main(void) {
  polytile_program *dot = NULL, *grad = NULL;
  polytile_compiled *run_dot = NULL, *run_grad = NULL;
  if (polytile_parse("function (X[N], W[N]) -> (Y) { Y[0 : 1] = +(X[i] * W[i]); }", &dot) ||
      polytile_gradient(dot, NULL, 0, &grad)) {  /* d/dX and d/dW: function (X, W, DY) -> (DX, DW) */
    fprintf(stderr, "polytile: %s\n", polytile_last_error());
    return 1;
  }
  float x[3] = {1, 2, 3}, w[3] = {4, 5, 6}, y[1], dy[1] = {1}, dx[3], dw[3];
  const int64_t n[] = {3}, one[] = {1};
  polytile_tensor in[] = {{"X", x, POLYTILE_F32, 1, n}, {"W", w, POLYTILE_F32, 1, n}, {"DY", dy, POLYTILE_F32, 1, one}};
  polytile_tensor out[] = {{"Y", y, POLYTILE_F32, 1, one}};
  polytile_tensor grads[] = {{"DX", dx, POLYTILE_F32, 1, n}, {"DW", dw, POLYTILE_F32, 1, n}};
  if (polytile_compile(dot, in, 2, "cpu", &run_dot) || polytile_run(run_dot, in, 2, out, 1) ||
      polytile_compile(grad, in, 3, "cpu", &run_grad) || polytile_run(run_grad, in, 3, grads, 2)) {
    fprintf(stderr, "polytile: %s\n", polytile_last_error());
    return 1;
  }
  printf("polytile %s: x.w = %g, d/dx = (%g, %g, %g), d/dw = (%g, %g, %g)\n", polytile_version(), y[0], dx[0], dx[1], dx[2],
         dw[0], dw[1], dw[2]);
  polytile_compiled_free(run_grad);
  polytile_compiled_free(run_dot);
  polytile_program_free(grad);
  polytile_program_free(dot);
  return y[0] == 32 && dx[2] == 6 && dw[0] == 1 ? 0 : 1;
}
