/* Times one 3x3, pad-1 convolution layer (forward and backward, training
 * mode) with each CPU algorithm in the same process (im2col, Winograd, the
 * direct loop), so that the ratio between them survives a noisy machine.
 *
 * usage: conv-bench N C O H [REPS] [f32|f16|bf16] [im2col|winograd|direct|all] [STRIDE]
 *   N samples of C x H x H into O channels; REPS timed steps after one warm-up;
 *   the algorithm argument runs one alone (for a profiler), default all;
 *   STRIDE 1 (default) or more (im2col alone then: the others are stride 1's).
 * The backward is the weight gradient and the input gradient. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ampc/ampc.h"

static int run(ampc_conv_algo algo, int64_t N, int64_t C, int64_t O, int64_t H, int stride, int reps, ampc_dtype dt, double *tf,
               double *tb, double *tbd, double *tbw) {
  ampc_graph *g = NULL;
  if (ampc_graph_create(&g) < 0) return -1;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(N, C, H, H));
  /* a parameter added to the input, so that the convolution's input gradient is wanted */
  ampc_value p = ampc_graph_param(g, "p", ampc_shape4(N, C, H, H), 0, NULL);
  ampc_value w = ampc_graph_param(g, "w", ampc_shape4(O, C, 3, 3), 0, NULL);
  ampc_value y = ampc_graph_conv2d(g, ampc_graph_add(g, x, p), w, AMPC_VALUE_NONE, stride, 1);
  ampc_value lab = ampc_graph_labels(g, "y", N);
  ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_flatten(g, ampc_graph_global_avgpool(g, y)), lab, 0.0f);
  ampc_graph_precision pr = {dt, AMPC_DTYPE_F32, dt, 0, dt == AMPC_DTYPE_BF16 ? AMPC_DTYPE_BF16 : AMPC_DTYPE_F16, NULL};
  ampc_backend_opts bo;
  ampc_backend_opts_default(&bo);
  bo.conv = algo;
  if (ampc_graph_set_backend(g, "cpu", &bo) < 0 || ampc_graph_set_precision(g, &pr) < 0 || ampc_graph_compile(g) < 0) {
    fprintf(stderr, "conv-bench: %s\n", ampc_last_error());
    ampc_graph_free(g);
    return -1;
  }
  int rc = 0;
  for (int r = 0; r <= reps && rc == 0; r++) {
    if (r == 1) ampc_graph_set_profiling(g, 1); /* after the warm-up */
    if (ampc_graph_forward(g, 1) < 0 || ampc_graph_backward(g, loss, 1.0f, 0) < 0) rc = -1;
  }
  ampc_backend_stats st;
  ampc_graph_backend_stats(g, &st, 0);
  *tf = st.fwd[AMPC_OP_CONV2D] / reps;
  *tb = st.bwd[AMPC_OP_CONV2D] / reps;
  *tbd = st.conv_bwd_data / reps;
  *tbw = st.conv_bwd_weights / reps;
  if (rc < 0) fprintf(stderr, "conv-bench: %s\n", ampc_last_error());
  ampc_graph_free(g);
  return rc;
}

int main(int argc, char **argv) {
  /* OpenBLAS's kernels for this CPU where it did not know the model (see
   * ampc_blas_better_core()): im2col's products run on them */
  const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : ampc_blas_better_core();
  if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0) execv("/proc/self/exe", argv);
  if (argc < 5 || strcmp(argv[1], "--help") == 0) {
    fprintf(argc < 5 ? stderr : stdout, "usage: conv-bench N C O H [REPS] [f32|f16|bf16] [im2col|winograd|direct|all] [STRIDE]\n");
    return argc < 5 ? 2 : 0;
  }
  int64_t N = atoll(argv[1]), C = atoll(argv[2]), O = atoll(argv[3]), H = atoll(argv[4]);
  int reps = argc > 5 ? atoi(argv[5]) : 3;
  const char *ty = argc > 6 ? argv[6] : "f32", *only = argc > 7 ? argv[7] : "all";
  int stride = argc > 8 ? atoi(argv[8]) : 1;
  ampc_dtype dt = strcmp(ty, "f16") == 0 ? AMPC_DTYPE_F16 : strcmp(ty, "bf16") == 0 ? AMPC_DTYPE_BF16 : AMPC_DTYPE_F32;
  if (N < 1 || C < 1 || O < 1 || H < 1 || reps < 1 || stride < 1 || stride > H || (dt == AMPC_DTYPE_F32 && strcmp(ty, "f32") != 0) ||
      (stride > 1 && strcmp(only, "im2col") != 0 && strcmp(only, "all") != 0) ||
      (strcmp(only, "all") != 0 && strcmp(only, "im2col") != 0 && strcmp(only, "winograd") != 0 && strcmp(only, "direct") != 0)) {
    fprintf(stderr, "conv-bench: N, C, O, H and REPS must be positive integers, the type f32, f16 or bf16, the algorithm "
                    "im2col, winograd, direct or all, the stride 1..H (im2col or all where it is more than 1)\n");
    return 2;
  }
  int64_t OH = (H + 2 - 3) / stride + 1; /* pad 1 */
  double flops = 2.0 * (double)N * (double)O * (double)C * 9.0 * (double)(OH * OH), base_f = 0, base_b = 0;
  static const struct { ampc_conv_algo a; const char *name; } algos[] = {{AMPC_CONV_IM2COL, "im2col"}, {AMPC_CONV_WINOGRAD, "winograd"}, {AMPC_CONV_DIRECT, "direct"}};
  printf("conv 3x3 stride %d N=%lld C=%lld O=%lld %lldx%lld %s, %d threads\n", stride, (long long)N, (long long)C, (long long)O,
         (long long)H, (long long)H, ty, omp_get_max_threads());
  const char *base_name = NULL; /* the first algorithm run: the others' ratios are against it */
  for (int i = 0; i < 3; i++) {
    double tf, tb, tbd, tbw;
    if ((strcmp(only, "all") != 0 && strcmp(only, algos[i].name) != 0) || (stride > 1 && algos[i].a != AMPC_CONV_IM2COL)) continue;
    if (run(algos[i].a, N, C, O, H, stride, reps, dt, &tf, &tb, &tbd, &tbw) < 0) return 1;
    if (!base_name) {
      base_name = algos[i].name;
      base_f = tf;
      base_b = tb;
    }
    printf("%-9s forward %7.1f ms (%5.0f GFLOP/s direct-equivalent)  backward %7.1f ms (%5.0f; data %.1f, weights %.1f)  vs %s %.2fx / %.2fx\n",
           algos[i].name, tf * 1e3, flops / tf * 1e-9, tb * 1e3, 2 * flops / tb * 1e-9, tbd * 1e3, tbw * 1e3, base_name, base_f / tf, base_b / tb);
  }
  return 0;
}
