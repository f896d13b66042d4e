/* Ahead of time: the seed's strided dilated conv, compiled by
 *   polytile compile examples/conv2d_strided_dilated.tile --target cpu --shape I=2x9x9x5 --shape K=2x2x5x7 -o DIR/seed_conv
 * into seed_conv.o and seed_conv.h, and called from C with nothing of polytile at run time:
 *   cc aot_tour.c DIR/seed_conv.o -IDIR -lm */
#include <stdio.h>

#include "seed_conv.h"

int main(void) {
  static float I[2 * 9 * 9 * 5], K[2 * 2 * 5 * 7], O[2 * 3 * 3 * 7];
  for (int e = 0; e < 2 * 9 * 9 * 5; ++e) I[e] = (float)(e % 7) - 3;
  for (int e = 0; e < 2 * 2 * 5 * 7; ++e) K[e] = (float)(e % 5) * 0.5f;
  /* No workspace (this program needs none: SEED_CONV_WORKSPACE_BYTES is 0), no parallel_for: this thread. */
  if (seed_conv(I, K, O, NULL, NULL, NULL) != 0) return 1;
  /* O[1, 2, 1, 3] by hand: the sum over j, i, ci of I[1, 3*2 + 2*j, 3*1 + 2*i, ci] * K[j, i, ci, 3]. */
  float want = 0;
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < 2; ++i)
      for (int ci = 0; ci < 5; ++ci) want += I[((1 * 9 + 6 + 2 * j) * 9 + 3 + 2 * i) * 5 + ci] * K[((j * 2 + i) * 5 + ci) * 7 + 3];
  const float got = O[((1 * 3 + 2) * 3 + 1) * 7 + 3];
  printf("O[1, 2, 1, 3] = %g (by hand: %g); workspace: %d bytes\n", got, want, SEED_CONV_WORKSPACE_BYTES);
  return got == want ? 0 : 1;
}
