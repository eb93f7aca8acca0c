/* Every graph op in every storage type against naive fp64 references
 * written here, and on two backends against each other.
 *
 * The ops run in the small graphs of op_harness.h. Checks, for each op case
 * and each precision (f32, f16, bf16, and O1 autocast with f32 parameters
 * and f16 activations):
 *  - forward against the fp64 reference computed from the values ampc stored
 *    (h and parameters after rounding to their storage type, and to the half
 *    type where autocast runs the op in half), with the normalised error
 *    max|got - ref| / max|ref| within a tolerance of the output's type;
 *  - backward against the fp64 reference backward fed with the output
 *    gradient ampc stored (grad(y)), so each op is checked on its own;
 *  - in f32, the gradients of P and of the op's parameters against central
 *    finite differences of the loss (the whole chain, ampc's own forward);
 *  - the backend axis: the same case on a second backend (cpu-guarded, or
 *    AMPC_TEST_BACKEND=name) gives the cpu backend's outputs, gradients and
 *    running statistics: bit for bit for cpu-guarded (the same kernels), to
 *    the precision's tolerance elsewhere;
 *  - 1 thread against 2, and Winograd's bits across thread counts.
 * The graph's own behaviour (set_batch, accumulation, fusion, errors) is
 * test_graph.c's.
 */
#include "op_harness.h"
#include "backend/cpu/cpu_internal.h"
#include "core/graph_internal.h"


/* The second backend of the axis. */
static const char *other_backend(void) {
  const char *e = getenv("AMPC_TEST_BACKEND");
  return e && *e ? e : "cpu-guarded";
}

/* One forward and backward of the case on the cpu backend and on the other
 * one; everything each stored must agree. */
static void compare_backends(const op_case *cs, const prec_case *pc) {
  /* the quick pass (the sanitizer build) compares in f32 only */
  if (getenv("AMPC_TEST_QUICK") && pc != &PRECS[0]) return;
  const char *other = other_backend(), *saved = test_backend;
  net a = {0}, b = {0};
  test_backend = "cpu";
  int ok = build(&a, cs, &pc->p, cs->n, 0) == 0;
  test_backend = other;
  ok = ok && build(&b, cs, &pc->p, cs->n, 0) == 0;
  test_backend = saved;
  if (ok) {
    for (int r = 0; r < 2; r++) {
      net *t = r ? &b : &a;
      CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
      CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
    }
    snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
    char what[64];
    snprintf(what, sizeof what, "cpu vs %s", other);
    compare_snapshots(&sa, &sb, strcmp(other, "cpu-guarded") == 0 ? 0.0 : prec_tol(&pc->p), what);
  }
  ampc_graph_free(a.g);
  ampc_graph_free(b.g);
  tmp_free_all();
}

static void run_case(const op_case *cs, const prec_case *pc) {
  const ampc_graph_precision *pr = &pc->p;
  ctx_case = cs->name;
  ctx_prec = pc->name;
  net t;
  if (build(&t, cs, pr, cs->n, 0) < 0) {
    ampc_graph_free(t.g);
    tmp_free_all();
    return;
  }
  ampc_graph *g = t.g;
  int training = training_of(cs);
  ampc_tensor yt = ampc_graph_tensor(g, t.y);
  ampc_dtype yd = expected_out_type(cs, pr);
  CHECK_MSG(yt.dtype == yd, "%s [%s]: output stored as %s, expected %s", cs->name, pc->name, ampc_dtype_name(yt.dtype),
            ampc_dtype_name(yd));
  CHECK_MSG(ampc_graph_tensor(g, t.h).dtype == pr->act_type, "%s [%s]: h stored as %s", cs->name, pc->name,
            ampc_dtype_name(ampc_graph_tensor(g, t.h).dtype));

  if (cs->k == K_FLATTEN) /* a view of h: (N, C*H*W) */
    CHECK(yt.shape.ndim == 2 && yt.shape.d[0] == cs->n && yt.shape.d[1] == per_sample(cs));
  CHECK_OK(ampc_graph_forward(g, training));
  ref_result rf = reference(cs, &t, pr, 0, 1.0);
  double tf = tol_of(yt.dtype);
  check_close("forward", val_f32(g, t.y), rf.y, rf.ny, tf);
  if (is_bn(cs)) {
    check_close("running_mean", val_f32(g, t.rm), rf.rm, (size_t)cs->c, 1e-5);
    check_close("running_var", val_f32(g, t.rv), rf.rv, (size_t)cs->c, 1e-5);
    int64_t nbt = read_i64(g, t.nbt);
    CHECK_MSG(nbt == (training ? 1 : 0), "%s [%s]: num_batches_tracked %lld", cs->name, pc->name, (long long)nbt);
  }

  CHECK_OK(ampc_graph_backward(g, t.loss, 1.0f, 0));
  ref_result rb = reference(cs, &t, pr, 1, 1.0);
  ampc_tensor dht = ampc_graph_grad(g, t.h);
  float *dh = grad_f32(g, t.h);
  check_close("grad h", dh, rb.dh, rb.nh, tol_max(tol_of(dht.dtype), tf));
  /* the gradient of h reaches P through cast and add unchanged */
  float *dp = grad_f32(g, t.p);
  size_t same = 0;
  for (size_t i = 0; i < rb.nh; i++) same += dp[i] == dh[i];
  CHECK_MSG(same == rb.nh, "%s [%s]: grad P differs from grad h in %zu of %zu", cs->name, pc->name, rb.nh - same, rb.nh);
  float *dw = NULL, *db = NULL, *dp2 = NULL;
  if (t.w >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.w);
    dw = grad_f32(g, t.w);
    check_close(is_bn(cs) ? "grad gamma" : "grad weight", dw, rb.dw, rb.nw, tol_max(tol_of(gt.dtype), tf));
  }
  if (t.b >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.b);
    db = grad_f32(g, t.b);
    check_close(is_bn(cs) ? "grad beta" : "grad bias", db, rb.db, rb.nb, tol_max(tol_of(gt.dtype), tf));
  }
  if (t.h2 >= 0) {
    ampc_tensor gt = ampc_graph_grad(g, t.h2);
    check_close("grad h2", grad_f32(g, t.h2), rb.dh2, rb.nh, tol_max(tol_of(gt.dtype), tf));
    dp2 = grad_f32(g, t.p2);
  }

  /* finite differences need a smooth loss: not in half precision, and not
   * through a cast to half (a staircase whose derivative is taken as 1);
   * and one of few terms: over 10^5 of them an f32 loss moves by its own
   * rounding as much as by the step (big cases have the fp64 reference) */
  int smooth = !(cs->k == K_CAST && cs->to != AMPC_DTYPE_F32) && numel_of(yt) <= 100000 && !cs->no_fd;
  if (pr->act_type == AMPC_DTYPE_F32 && pr->param_type == AMPC_DTYPE_F32 && smooth) {
    check_fd(&t, t.p, dp, "P", training);
    if (dw) check_fd(&t, t.w, dw, is_bn(cs) ? "gamma" : "weight", training);
    if (db) check_fd(&t, t.b, db, is_bn(cs) ? "beta" : "bias", training);
    if (dp2) check_fd(&t, t.p2, dp2, "P2", training);
  }
  ampc_graph_free(g);
  tmp_free_all();
  compare_backends(cs, pc);
}

static void run_kind(kind k) {
  int n = 0;
  for (int i = 0; i < NCASES; i++)
    if (CASES[i].k == k) {
      for (int p = 0; p < NPRECS; p++) run_case(&CASES[i], &PRECS[p]);
      n++;
    }
  CHECK(n > 0);
}
/* ... in the precisions that store activations in 16 bits only */
static void run_kind_half(kind k) {
  int n = 0;
  for (int i = 0; i < NCASES; i++)
    if (CASES[i].k == k)
      for (int p = 0; p < NPRECS; p++)
        if (PRECS[p].p.act_type != AMPC_DTYPE_F32) {
          run_case(&CASES[i], &PRECS[p]);
          n++;
        }
  CHECK(n > 0);
}

TEST(conv2d) { run_kind(K_CONV); }
/* Every case again with the plain im2col path forced (its products on
 * sgemm and on ampc's kernel), and with Winograd
 * forced wherever it applies (stride 1, 3x3): with the default chunks, with
 * chunks that cut a sample into bands of tile rows, and with chunks of
 * several samples; in f32 with both tiles, F(2x2) (the default there) and
 * F(4x4) (the one of 16-bit storage); with every product on the library's
 * sgemm (the path past 512 channels); and with the same-size convolutions'
 * planes never packed, and packed 2 x 2 and 3 x 3 to a canvas (canvases
 * with empty places, cut into bands of tile rows, in chunks of several);
 * where storage is 16-bit, the same in F(6x6) and in F(4x4) forced. */
/* Every case of kind k as the CPU gives it, then with its products on
 * sgemm (blas_hook set) and on ampc's 16-wide kernel (forced: the portable
 * build of it where the CPU has no AVX-512). */
static void run_kind_both_products(kind k, int *blas_hook) {
  run_kind(k);
  *blas_hook = 1;
  run_kind(k);
  *blas_hook = 0;
  ampc__cpu_gemm_force_wide = 1;
  run_kind(k);
  ampc__cpu_gemm_force_wide = 0;
}
TEST(conv2d_im2col) {
  test_conv_algo = AMPC_CONV_IM2COL;
  run_kind_both_products(K_CONV, &ampc__cpu_conv_blas);
  test_conv_algo = AMPC_CONV_AUTO;
}
/* Winograd's passes over the convolution cases (run: every precision, or
 * the 16-bit ones): chunks of the default size, of bands of tile rows (5)
 * and of several samples (20); in f32 also F(4x4) (f32_tiles); the products
 * on sgemm (blas); packing off and forced, with chunks of bands and of
 * several canvases (the sanitizer pass runs the first two). */
static void wino_passes(void (*run)(kind), int f32_tiles, int blas) {
  static const int64_t targets[] = {0, 5, 20};
  static const struct { int pack, f32_tile; int64_t target; } packs[] = {
      {2, 4, 5}, {3, 4, 300}, {3, 0, 0}, {2, 0, 300}, {-1, 4, 0}};
  for (int t = 0; t < f32_tiles; t++) {
    ampc__cpu_wino_f32_tile = t ? 4 : 0;
    for (int i = 0; i < 3; i++) {
      ampc__cpu_wino_tile_target = targets[i];
      run(K_CONV);
    }
  }
  ampc__cpu_wino_tile_target = 0;
  ampc__cpu_wino_f32_tile = 0;
  ampc__cpu_wino_blas = blas;
  if (blas) run(K_CONV);
  ampc__cpu_wino_blas = 0;
  for (int i = 0; i < (getenv("AMPC_TEST_QUICK") ? 2 : 5); i++) {
    ampc__cpu_wino_pack = packs[i].pack;
    ampc__cpu_wino_f32_tile = packs[i].f32_tile;
    ampc__cpu_wino_tile_target = packs[i].target;
    run(K_CONV);
  }
  ampc__cpu_wino_pack = 0;
  ampc__cpu_wino_tile_target = 0;
  ampc__cpu_wino_f32_tile = 0;
}
TEST(conv2d_winograd) {
  test_conv_algo = AMPC_CONV_WINOGRAD;
  wino_passes(run_kind, 2, 1);
  /* 16-bit storage on each tile, F(6x6) and F(4x4), forced (the library
   * picks one per shape) */
  for (int t = 0; t < 2; t++) {
    ampc__cpu_wino_tile16 = t ? 4 : 6;
    wino_passes(run_kind_half, 1, !t);
  }
  ampc__cpu_wino_tile16 = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}
/* and the direct loop forced wherever it applies (stride 1, 3x3) */
TEST(conv2d_direct) {
  test_conv_algo = AMPC_CONV_DIRECT;
  run_kind(K_CONV);
  test_conv_algo = AMPC_CONV_AUTO;
}
/* Batch norm's planes of up to 64 values go a sample at a time: every
 * case again with the channel loop forced. */
static void run_kind_both_bn_loops(kind k) {
  run_kind(k);
  ampc__cpu_bn_by_channel = 1;
  run_kind(k);
  ampc__cpu_bn_by_channel = 0;
}
/* the kernels' inline element sizes are ampc_dtype_size's */
TEST(cpu_dtype_size_matches) {
  for (int t = 0; t < AMPC_DTYPE_COUNT; t++) CHECK(cpu_dtype_size((ampc_dtype)t) == ampc_dtype_size((ampc_dtype)t));
}
TEST(batchnorm2d_train) { run_kind_both_bn_loops(K_BN_TRAIN); }
/* PyTorch's eval-mode batch norm is differentiable with the running
 * statistics as constants: dx = dy * gamma / sqrt(running_var + eps). */
TEST(batchnorm2d_eval) { run_kind_both_bn_loops(K_BN_EVAL); }
TEST(relu) { run_kind(K_RELU); }
TEST(maxpool2d) { run_kind(K_MAXPOOL); }
TEST(avgpool2d) { run_kind(K_AVGPOOL); }
TEST(global_avgpool) { run_kind(K_GAP); }
TEST(linear) { run_kind_both_products(K_LINEAR, &ampc__cpu_linear_blas); }
TEST(add) { run_kind(K_ADD); }
TEST(flatten) { run_kind(K_FLATTEN); }
TEST(softmax) { run_kind(K_SOFTMAX); }
TEST(log_softmax) { run_kind(K_LOG_SOFTMAX); }
TEST(cross_entropy) { run_kind(K_CE); }
TEST(cast) { run_kind(K_CAST); }

/* One thread and two give the same results (within f32 rounding: the
 * convolution cuts its batch into chunks by thread count). */
TEST(thread_counts_agree) {
  for (int i = 0; i < NCASES; i++)
    for (int p = 0; p < NPRECS; p++) {
      const op_case *cs = &CASES[i];
      ctx_case = cs->name;
      ctx_prec = PRECS[p].name;
      net a = {0}, b = {0};
      int ok = build(&a, cs, &PRECS[p].p, cs->n, 1) == 0 && build(&b, cs, &PRECS[p].p, cs->n, 2) == 0;
      if (ok) {
        for (int r = 0; r < 2; r++) {
          net *t = r ? &b : &a;
          CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
          CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
        }
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        compare_snapshots(&sa, &sb, prec_tol(&PRECS[p].p), "1 vs 2 threads");
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      tmp_free_all();
    }
}

/* One training forward and backward of each of two graphs of case cs,
 * whose values and gradients must then be the same bits. */
static void run_and_compare(net *a, net *b, const op_case *cs, const char *what) {
  for (int r = 0; r < 2; r++) {
    net *q = r ? b : a;
    CHECK_OK(ampc_graph_forward(q->g, 1));
    CHECK_OK(ampc_graph_backward(q->g, q->loss, 1.0f, 0));
  }
  snapshot sa = take_snapshot(a, cs), sb = take_snapshot(b, cs);
  compare_snapshots(&sa, &sb, 0.0, what);
}

/* Winograd's results are the same bits for any thread count, whether the
 * threads share each chunk (few chunks) or take whole chunks each (many). */
TEST(winograd_same_bits_any_threads) {
  static const char *names[] = {"conv3x3_16x16", "conv3x3_24ch", "conv3x3_14x14"};
  static const int64_t targets[] = {0, 5};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  /* the library's tiles, then F(6x6) forced where storage is 16-bit */
  for (int i = 0; i < 6; i++)
    for (int t = 0; t < 2; t++)
      for (int p = 0; p < NPRECS; p++) {
        const op_case *cs = find_case(names[i % 3]);
        ampc__cpu_wino_tile16 = i < 3 ? 0 : 6;
        if (i >= 3 && PRECS[p].p.act_type == AMPC_DTYPE_F32) continue;
        ctx_case = cs->name;
        ctx_prec = PRECS[p].name;
        ampc__cpu_wino_tile_target = targets[t];
        net a = {0}, b = {0};
        for (int nt = 2; nt <= 3; nt++)
          if (build(&a, cs, &PRECS[p].p, cs->n, 1) == 0 && build(&b, cs, &PRECS[p].p, cs->n, nt) == 0) {
            run_and_compare(&a, &b, cs, "1 thread vs several, bit for bit");
            ampc_graph_free(a.g);
            ampc_graph_free(b.g);
            tmp_free_all();
          }
      }
  ampc__cpu_wino_tile16 = 0;
  ampc__cpu_wino_tile_target = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

/* A graph built for a batch and run at smaller ones (ampc_graph_set_batch)
 * gives the bits of a graph built for the smaller batch: Winograd packs the
 * 14 x 14 planes of 18 samples 3 x 3 to a canvas, of 17 and 9 samples too,
 * of 10 and 5 not at all, and the workspace laid out for 18 holds each
 * (else the convolution would fall back to im2col: other bits). Chunks of
 * 96 tiles, the cnn's: 6 samples of 16 tiles take more room than a band of
 * 6 of a canvas' 11 tile rows. Then in F(6x6) (16-bit storage; the
 * library's choice for more channels than this case's), whose canvases of
 * 2 x 2 planes differ with the batch again. */
TEST(winograd_smaller_batch_same_bits) {
  const op_case *cs = find_case("conv3x3_14x14");
  static const int64_t smaller[] = {17, 10, 9, 5};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  ampc__cpu_wino_tile_target = 96;
  for (int p = 0; p < 2 * NPRECS; p++)
    for (int i = 0; i < 4; i++) {
      ampc__cpu_wino_tile16 = p < NPRECS ? 0 : 6;
      if (p >= NPRECS && PRECS[p % NPRECS].p.act_type == AMPC_DTYPE_F32) continue;
      ctx_case = cs->name;
      ctx_prec = PRECS[p % NPRECS].name;
      net a = {0}, b = {0};
      if (build(&a, cs, &PRECS[p % NPRECS].p, cs->n, 2) == 0 && build(&b, cs, &PRECS[p % NPRECS].p, smaller[i], 2) == 0) {
        CHECK_OK(ampc_graph_set_batch(a.g, smaller[i]));
        run_and_compare(&a, &b, cs, "built for 18 samples, run at fewer, bit for bit");
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      tmp_free_all();
    }
  ampc__cpu_wino_tile16 = 0;
  ampc__cpu_wino_tile_target = 0;
  /* the cnn's second layer's channels (32 -> 64) on 14 x 14 planes, where
   * the library chooses F(6x6) in 16-bit storage (canvases of 2 x 2 planes:
   * 5 at 18 samples, 4 at 16, 3 at 9, the last part empty): Winograd's
   * bits, not im2col's (the workspace laid out for 18 holds the others) */
  op_case wide = *cs;
  wide.name = "conv3x3_14x14_32to64";
  wide.c = 32;
  wide.o = 64;
  static const int64_t wsmaller[] = {16, 9};
  for (int p = 0; p < NPRECS; p++)
    for (int i = 0; i < 2; i++) {
      if (PRECS[p].p.act_type == AMPC_DTYPE_F32) continue;
      ctx_case = wide.name;
      ctx_prec = PRECS[p].name;
      net a = {0}, b = {0}, c = {0};
      test_conv_algo = AMPC_CONV_IM2COL;
      int ok = build(&c, &wide, &PRECS[p].p, wsmaller[i], 2) == 0;
      test_conv_algo = AMPC_CONV_WINOGRAD;
      if (ok && build(&a, &wide, &PRECS[p].p, wide.n, 2) == 0 && build(&b, &wide, &PRECS[p].p, wsmaller[i], 2) == 0) {
        CHECK_OK(ampc_graph_set_batch(a.g, wsmaller[i]));
        run_and_compare(&a, &b, &wide, "built for 18 samples, run at fewer, bit for bit");
        /* ... and Winograd ran (its workspace held it): not im2col's bits */
        CHECK_OK(ampc_graph_forward(c.g, 1));
        CHECK_OK(ampc_graph_backward(c.g, c.loss, 1.0f, 0));
        snapshot sb = take_snapshot(&b, &wide), sc = take_snapshot(&c, &wide);
        size_t differ = 0;
        for (size_t k = 0; k < sb.n[4] && sb.n[4] == sc.n[4]; k++) differ += sb.v[4][k] != sc.v[4][k];
        CHECK_MSG(differ > 0, "%s [%s] at %lld samples: the weight gradient is im2col's, bit for bit", wide.name, PRECS[p].name,
                  (long long)wsmaller[i]);
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      ampc_graph_free(c.g);
      tmp_free_all();
    }
  test_conv_algo = AMPC_CONV_AUTO;
}

/* Case cs in precision pc, forward and backward on two threads, then run
 * again with the test hook *hook = value on nt threads (and compiled so when
 * build_too: a hook that lays out the workspace), the two compared within
 * tol; ws, when not NULL, gets the two graphs' workspace bytes. */
static void compare_hooked(const op_case *cs, const prec_case *pc, int *hook, int value, int build_too, int nt, double tol,
                           const char *what, size_t ws[2]) {
  ctx_case = cs->name;
  ctx_prec = pc->name;
  net a = {0}, b = {0};
  int ok = build(&a, cs, &pc->p, cs->n, 2) == 0;
  *hook = build_too ? value : 0;
  ok = ok && build(&b, cs, &pc->p, cs->n, nt) == 0;
  *hook = 0;
  if (ok) {
    for (int r = 0; r < 2; r++) {
      net *q = r ? &b : &a;
      *hook = r ? value : 0;
      CHECK_OK(ampc_graph_forward(q->g, 1));
      CHECK_OK(ampc_graph_backward(q->g, q->loss, 1.0f, 0));
    }
    *hook = 0;
    snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
    compare_snapshots(&sa, &sb, tol, what);
    for (int r = 0; ws && r < 2; r++) {
      ampc_mem_report m;
      ampc_graph_memory(r ? b.g : a.g, &m);
      ws[r] = ampc_mem_total(&m, AMPC_MEM_WORKSPACE);
    }
  }
  ampc_graph_free(a.g);
  ampc_graph_free(b.g);
  tmp_free_all();
}
static void compare_with_hook(const op_case *cs, const prec_case *pc, int *hook, double tol, const char *what) {
  compare_hooked(cs, pc, hook, 1, 0, 2, tol, what, NULL);
}

/* Winograd's small products give the same bits through the 16-wide kernel
 * (AVX-512's; here forced, so it runs on any CPU) as through the 8-wide one:
 * each output is the same in-order sum. Where the CPU has AVX-512 the default
 * is its 16-wide build, and the forced run the portable build of the same. */
TEST(winograd_wide_kernel_same_bits) {
  static const char *names[] = {"conv3x3_16x16", "conv3x3_24ch", "conv3x3_32to40"};
  static const int64_t targets[] = {0, 5};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  for (int i = 0; i < 3; i++)
    for (int t = 0; t < 2; t++)
      for (int p = 0; p < NPRECS; p++) {
        ampc__cpu_wino_tile_target = targets[t];
        compare_with_hook(find_case(names[i]), &PRECS[p], &ampc__cpu_gemm_force_wide, 0.0, "8-wide vs 16-wide kernel, bit for bit");
      }
  ampc__cpu_wino_tile_target = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

/* The im2col path on ampc's kernel gives the same bits for any thread
 * count: the forward's and backward data's outputs are each one in-order sum
 * whatever the group of samples, and the weight gradient's threads each sum
 * the columns of a share of the input channels over every sample in order
 * (shapes whose blocks are all multiples of 8 columns, which the kernel
 * takes; the bf16 engines, whose sums pair columns as the groups of samples
 * do, are off). */
TEST(im2col_same_bits_any_threads) {
  static const char *names[] = {"conv3x3_16x16", "conv3x3_s2_32ch", "conv3x3_32to40"};
  int none = 0;
  test_conv_algo = AMPC_CONV_IM2COL;
  ampc__cpu_gemm_force_wide = 1;
  ampc__cpu_amx_off = ampc__cpu_bf16dp_off = 1;
  for (int i = 0; i < 3; i++)
    for (int p = 0; p < NPRECS; p++)
      for (int nt = 1; nt <= 3; nt += 2)
        compare_hooked(find_case(names[i]), &PRECS[p], &none, 0, 0, nt, 0.0, "2 threads vs 1 and 3, bit for bit", NULL);
  ampc__cpu_amx_off = ampc__cpu_bf16dp_off = 0;
  ampc__cpu_gemm_force_wide = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

/* A single-chunk layer whose U is made a block of output channels at a
 * time (ResNet-18's 512-channel layers) gives the bits of one pass: each
 * output is the same in-order sum whatever the block. Blocks of 8, 16 and 24
 * channels, whole and partial (20 and 40 output channels; 24 and 32 input,
 * backward data's blocks), in f32 and in 16-bit storage on both their tiles
 * (the packed canvas below in F(6x6)), on 1,
 * 2 and 3 threads against 2 unblocked; with the products on sgemm too (whose
 * own blocking may differ with the block: close, not the same bits). */
TEST(winograd_blocks_same_bits) {
  static const char *names[] = {"conv3x3_24ch", "conv3x3_32to40"};
  static const int blocks[] = {8, 16, 24};
  test_conv_algo = AMPC_CONV_WINOGRAD;
  ampc__cpu_wino_tile_target = 100000; /* one chunk */
  for (int t = 0; t < 2; t++) {
    ampc__cpu_wino_f32_tile = t ? 4 : 0; /* f32: F(2x2), F(4x4); 16-bit storage: F(4x4), F(6x6) */
    ampc__cpu_wino_tile16 = t ? 6 : 4;
    for (int i = 0; i < 2; i++)
      for (int b = 0; b < 3; b++)
        for (int p = 0; p < NPRECS; p++)
          for (int nt = 1; nt <= 3; nt++) {
            const op_case *cs = find_case(names[i]);
            size_t ws[2] = {0, 0};
            compare_hooked(cs, &PRECS[p], &ampc__cpu_wino_block, blocks[b], 1, nt, 0.0,
                           "one pass vs blocks of output channels, bit for bit", ws);
            /* the blocks took effect: U is smaller (the only convolution here) */
            if (nt == 2 && blocks[b] < (cs->c > cs->o ? cs->c : cs->o)) CHECK(ws[1] < ws[0]);
          }
  }
  /* planes packed to a canvas (one chunk of one canvas) */
  ampc__cpu_wino_pack = 2;
  for (int p = 0; p < NPRECS; p++)
    compare_hooked(find_case("conv3x3_24ch"), &PRECS[p], &ampc__cpu_wino_block, 8, 1, 2, 0.0,
                   "planes packed 2 x 2: one pass vs blocks of output channels, bit for bit", NULL);
  ampc__cpu_wino_pack = 0;
  ampc__cpu_wino_f32_tile = 0;
  ampc__cpu_wino_tile16 = 0;
  ampc__cpu_wino_blas = 1;
  for (int p = 0; p < NPRECS; p++)
    compare_hooked(find_case("conv3x3_32to40"), &PRECS[p], &ampc__cpu_wino_block, 16, 1, 2, prec_tol(&PRECS[p].p),
                   "one pass vs blocks of output channels, products on sgemm", NULL);
  ampc__cpu_wino_blas = 0;
  ampc__cpu_wino_tile_target = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

/* The direct loop's 16-wide (AVX-512) code through its portable build,
 * forced so that it runs on any CPU, against the f64 reference like every
 * path; and against the 8-wide loop (on an AVX-512 CPU the device's level
 * is set to AVX2 for that run): the forward is the same in-order sum (the
 * same bits), the weight gradient sums in 16 lanes instead of 8 (close).
 * Where the CPU has AVX-512, its own build of the 16-wide loops (the
 * default there) gives the portable build's bits. Shapes: planes of 1 to 37
 * columns (one or two 16-column vectors, whole and partial), 1 to 5 output
 * channels (groups of 4 and their remainders). */
TEST(conv2d_direct_wide) {
  test_conv_algo = AMPC_CONV_DIRECT;
  ampc__cpu_direct_wide = 1;
  run_kind(K_CONV);
  ampc__cpu_direct_wide = 0;
  test_conv_algo = AMPC_CONV_AUTO;
}

TEST(direct_wide_kernel_same_forward) {
  static const char *names[] = {"conv3x3_s1_p1_bias", "conv3x3_c1_wide", "conv3x3_c1_p0_w11", "conv3x3_s1_p2", "conv3x3_16x16"};
  test_conv_algo = AMPC_CONV_DIRECT;
  for (int i = 0; i < 5; i++)
    for (int p = 0; p < NPRECS; p++) {
      const op_case *cs = find_case(names[i]);
      ctx_case = cs->name;
      ctx_prec = PRECS[p].name;
      int avx512 = ampc__cpu_isa_avx512 && ampc__cpu_has_avx512();
      net a = {0}, b = {0}, c = {0};
      if (build(&a, cs, &PRECS[p].p, cs->n, 2) == 0 && build(&b, cs, &PRECS[p].p, cs->n, 2) == 0 &&
          (!avx512 || build(&c, cs, &PRECS[p].p, cs->n, 2) == 0)) {
        if (avx512) ampc__cpu_set_isa(ampc__graph_device(a.g), ampc__cpu_isa_avx2); /* a: the 8-wide loop */
        for (int r = 0; r < 2 + avx512; r++) {
          net *q = r == 0 ? &a : r == 1 ? &b : &c; /* b: the portable 16-wide build; c: AVX-512's */
          ampc__cpu_direct_wide = r == 1;
          CHECK_OK(ampc_graph_forward(q->g, 1));
          CHECK_OK(ampc_graph_backward(q->g, q->loss, 1.0f, 0));
        }
        ampc__cpu_direct_wide = 0;
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        CHECK_MSG(sa.n[0] == sb.n[0] && memcmp(sa.v[0], sb.v[0], sa.n[0] * sizeof *sa.v[0]) == 0,
                  "%s [%s]: the 16-wide forward differs from the 8-wide one", cs->name, PRECS[p].name);
        compare_snapshots(&sa, &sb, prec_tol(&PRECS[p].p), "8-wide vs 16-wide loops");
        if (avx512) {
          snapshot sc = take_snapshot(&c, cs);
          compare_snapshots(&sb, &sc, 0.0, "the 16-wide loops' portable vs AVX-512 build, bit for bit");
        }
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      ampc_graph_free(c.g);
      tmp_free_all();
    }
  test_conv_algo = AMPC_CONV_AUTO;
}

/* The 2x2 max-pool gradient goes to each window's first maximum, a NaN
 * beating any number (PyTorch's choice), in the vectorised path (8 windows at
 * a time) and its scalar tail alike: windows of ties, NaNs in every position,
 * and plain maxima in every position. */
/* nw windows per row, R rows of windows: ties, one maximum, NaNs, through
 * the row path (nw >= 8, its last step overlapping when 8 does not divide
 * it), a step per row pair (4 <= nw < 8) and the gathered one (nw < 4) */
static void pool_ties_case(int nw, int R) {
  int W = 2 * nw, H = 2 * R, nwin = nw * R;
  float *x = calloc((size_t)(H * W), sizeof *x), *head = calloc((size_t)(2 * nwin), sizeof *head);
  int *winner = calloc((size_t)nwin, sizeof *winner);
  for (int w = 0; w < nwin; w++) {
    float *r0 = x + 2 * (w / nw) * W + 2 * (w % nw), *r1 = r0 + W;
    int kind = w % 7, pos = (w / 7 + w) % 4;
    r0[0] = r0[1] = r1[0] = r1[1] = 0.5f;
    winner[w] = 0;                                       /* kind 0: four ties */
    if (kind == 1) { r0[0] = r0[1] = r1[0] = r1[1] = -1.0f; }
    float *cell[4] = {&r0[0], &r0[1], &r1[0], &r1[1]};
    if (kind == 2 || kind == 3) { *cell[pos] = 2.0f; winner[w] = pos; }   /* one maximum */
    if (kind == 4) { *cell[pos] = NAN; winner[w] = pos; }                 /* one NaN */
    if (kind == 5) { *cell[3] = NAN; *cell[1] = NAN; winner[w] = 1; }     /* the first NaN */
    if (kind == 6) { *cell[pos] = 2.0f; *cell[(pos + 1) % 4] = 2.0f; winner[w] = pos < 3 ? pos : 0; } /* a tie of two */
  }
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value p = ampc_graph_param(g, "x", ampc_shape4(1, 1, H, W), 0, x);
  ampc_value y = ampc_graph_maxpool2d(g, p, 2, 2, 0);
  for (int i = 0; i < nwin; i++) head[i] = 1.0f; /* logit 0 = sum of the pooled values; logit 1 = 0 */
  ampc_value hw = ampc_graph_param(g, "head", ampc_shape2(2, nwin), 0, head);
  ampc_value lab = ampc_graph_labels(g, "y", 1);
  ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, ampc_graph_flatten(g, y), hw, AMPC_VALUE_NONE), lab, 0.0f);
  CHECK_OK(ampc_graph_compile(g));
  if (ampc_graph_is_compiled(g)) {
    write_labels(g, lab, (const int32_t[]){1});
    CHECK_OK(ampc_graph_forward(g, 1));
    CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
    const float *dx = grad_f32(g, p), *yv = val_f32(g, y);
    for (int w = 0; w < nwin; w++) {
      int at = 2 * (w / nw) * W + 2 * (w % nw);
      const float *d[4] = {dx + at, dx + at + 1, dx + at + W, dx + at + W + 1};
      const float want = x[at + (winner[w] & 1) + (winner[w] >> 1) * W];
      CHECK_MSG(isnan(want) ? isnan(yv[w]) : yv[w] == want, "%d x %d windows: window %d pooled %g, want %g", nw, R, w,
                (double)yv[w], (double)want);
      for (int q = 0; q < 4; q++)
        CHECK_MSG((*d[q] != 0.0f) == (q == winner[w]), "%d x %d windows: window %d: gradient %g at position %d, winner %d", nw,
                  R, w, (double)*d[q], q, winner[w]);
    }
  }
  ampc_graph_free(g);
  tmp_free_all();
  free(x);
  free(head);
  free(winner);
}

TEST(maxpool_backward_ties_and_nan) {
  pool_ties_case(5, 7); /* rows of 4 to 7 windows: a step per row pair */
  pool_ties_case(7, 3);
  pool_ties_case(4, 5);
  pool_ties_case(6, 1);
  pool_ties_case(3, 6); /* rows of 1 to 3: gathered, windows in reading order */
  pool_ties_case(1, 9);
  pool_ties_case(16, 2); /* along rows: whole steps */
  pool_ties_case(21, 1); /* along rows, the last step overlapping */
  pool_ties_case(37, 3);
  pool_ties_case(9, 4);
}

/* AMX: the packed product against a double reference over shapes with
 * partial tiles in every dimension, A and B stored either way, added to C,
 * and A packed in parts (as threads share it); then every convolution case
 * in bf16 on the im2col path with its products on the tiles, and by default
 * (3x3 stride-1 ones straight from padded planes), against the same with
 * the products in f32 (ampc__cpu_amx_off): the tiles' products are exact, so
 * the two differ only by the order of the f32 sums (and the bf16 rounding
 * of an output that lies on a tie). The op cases' runs above have already
 * checked the tiles' convolutions against the f64 reference wherever the
 * CPU has them. Where it has not, this says so and checks nothing. */
static float bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}
typedef void (*packed_gemm_fn)(int64_t m, int64_t n, int64_t k, const void *Ap, const void *Bp, float *C, int64_t ldc,
                               int add);
static void packed_products_check(packed_gemm_fn gemm, const char *engine) {
  static const int64_t dims[][3] = {{1, 1, 1}, {16, 16, 32}, {33, 17, 31}, {37, 45, 70}, {64, 96, 577}, {100, 33, 300}};
  uint64_t seed = 7;
  for (int d = 0; d < 6; d++)
    for (int v = 0; v < 8; v++) {
      int ta = v & 1, tb = (v >> 1) & 1, add = v >> 2;
      int64_t m = dims[d][0], n = dims[d][1], k = dims[d][2];
      float *A = malloc(sizeof(float) * (size_t)(m * k)), *B = malloc(sizeof(float) * (size_t)(k * n));
      float *C = malloc(sizeof(float) * (size_t)(m * n));
      double *R = malloc(sizeof(double) * (size_t)(m * n));
      for (int64_t i = 0; i < m * k; i++) A[i] = bf16_round((float)((seed = seed * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f);
      for (int64_t i = 0; i < k * n; i++) B[i] = bf16_round((float)((seed = seed * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f);
      for (int64_t i = 0; i < m * n; i++) R[i] = C[i] = add ? (float)(i % 7) - 3.0f : 99.0f;
      /* A (m x k) read as A[i][p]; stored transposed when ta; B likewise */
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double sum = add ? R[i * n + j] : 0.0;
          for (int64_t p = 0; p < k; p++)
            sum += (double)(ta ? A[p * m + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * n + j]);
          R[i * n + j] = sum;
        }
      void *pa = malloc(ampc__cpu_amx_pack_a_bytes(m, k)), *pb = malloc(ampc__cpu_amx_pack_b_bytes(k, n));
      for (int part = 0; part < 3; part++) ampc__cpu_amx_pack_a(m, k, A, ta ? m : k, ta, pa, part, 3);
      ampc__cpu_amx_pack_b(k, n, B, tb ? k : n, tb, pb);
      gemm(m, n, k, pa, pb, C, n, add);
      double worst = 0.0;
      for (int64_t i = 0; i < m * n; i++) {
        double e = fabs(C[i] - R[i]) / (1.0 + fabs(R[i]));
        if (!(e <= worst)) worst = e;
      }
      CHECK_MSG(worst <= 1e-5, "%s product %ldx%ldx%ld ta %d tb %d add %d: error %.3g", engine, (long)m, (long)n,
                (long)k, ta, tb, add, worst);
      free(A), free(B), free(C), free(R), free(pa), free(pb);
    }
}

/* Every convolution case in bf16 on im2col (algo 0) and by default (1),
 * and every linear case, against the same with the bf16 engine switched off
 * by hook: one bf16 step of the largest value at most. The graph with the
 * engine off is built so too: its workspace holds no packed operands, so
 * where the engine's is larger the engine ran -- counted in packed[algo]
 * and *linear; *strided says so of the strided case by default. */
static void bf16_engine_cases(int *hook, const char *what, int packed[2], int *strided, int *linear) {
  packed[0] = packed[1] = *strided = *linear = 0;
  for (int i = 0; i < NCASES; i++) {
    const op_case *cs = &CASES[i];
    if (cs->k != K_LINEAR) continue;
    size_t ws[2] = {0, 0};
    compare_hooked(cs, &PRECS[2], hook, 1, 1, 2, 1.0 / 128, what, ws);
    *linear += ws[0] > ws[1];
  }
  for (int algo = 0; algo < 2; algo++)
    for (int i = 0; i < NCASES; i++) {
      test_conv_algo = algo ? AMPC_CONV_AUTO : AMPC_CONV_IM2COL;
      const op_case *cs = &CASES[i];
      if (cs->k != K_CONV) continue;
      const prec_case *pc = &PRECS[2];
      CHECK(pc->p.act_type == AMPC_DTYPE_BF16 && pc->p.param_type == AMPC_DTYPE_BF16);
      size_t ws[2] = {0, 0};
      compare_hooked(cs, pc, hook, 1, 1, 2, 1.0 / 128, what, ws);
      packed[algo] += ws[0] > ws[1];
      if (algo && !strcmp(cs->name, "conv3x3_s2_32ch")) *strided = ws[0] > ws[1];
    }
  test_conv_algo = AMPC_CONV_AUTO;
}

TEST(conv2d_amx) {
  if (!ampc__cpu_amx()) {
    printf("  (no AMX-BF16 on this CPU, or not granted by the OS: the tiles' paths are not run here)\n");
    return;
  }
  packed_products_check(ampc__cpu_amx_gemm_packed, "AMX");
  /* im2col's products on the tiles; then the default, which takes 3x3
   * stride-1 convolutions straight from padded planes on the tiles. (The
   * dot products off: with the tiles off they would take the products.) */
  ampc__cpu_bf16dp_off = 1;
  int packed[2], strided, linear;
  bf16_engine_cases(&ampc__cpu_amx_off, "AMX tiles vs f32 products", packed, &strided, &linear);
  CHECK_MSG(packed[0] > 0 && strided && linear > 0,
            "the tiles' operands were not laid out: %d im2col cases, the strided one %d, %d linear ones", packed[0], strided,
            linear);
  ampc__cpu_bf16dp_off = 0;
}

/* AVX-512 BF16's dot products (the engine of CPUs with avx512_bf16 and no
 * tiles; on a CPU with tiles too, these are switched off to run it): the
 * packed product against the double reference as above, then the
 * convolution cases (by default the strided and 1x1 ones take it). */
TEST(conv2d_bf16_dot_products) {
  if (!ampc__cpu_bf16dp()) {
    printf("  (no AVX-512 BF16 on this CPU: the dot products' path is not run here)\n");
    return;
  }
  packed_products_check(ampc__cpu_dp_gemm_packed, "AVX-512 BF16");
  ampc__cpu_amx_off = 1;
  CHECK(strcmp(ampc_kernel_tiles(), "avx512-bf16") == 0);
  int packed[2], strided, linear;
  bf16_engine_cases(&ampc__cpu_bf16dp_off, "AVX-512 BF16 dot products vs f32 products", packed, &strided, &linear);
  CHECK_MSG(packed[0] > 0 && packed[1] > 0 && strided && linear > 0,
            "the dot products were not laid out: %d im2col cases, %d default ones, the strided one %d, %d linear ones",
            packed[0], packed[1], strided, linear);
  ampc__cpu_amx_off = 0;
}

TEST_MAIN(TEST_ENTRY(conv2d), TEST_ENTRY(conv2d_im2col), TEST_ENTRY(conv2d_winograd), TEST_ENTRY(conv2d_direct),
          TEST_ENTRY(winograd_same_bits_any_threads), TEST_ENTRY(winograd_smaller_batch_same_bits),
          TEST_ENTRY(winograd_wide_kernel_same_bits),
          TEST_ENTRY(winograd_blocks_same_bits), TEST_ENTRY(im2col_same_bits_any_threads),
          TEST_ENTRY(conv2d_direct_wide), TEST_ENTRY(direct_wide_kernel_same_forward), TEST_ENTRY(conv2d_amx), TEST_ENTRY(conv2d_bf16_dot_products),
          TEST_ENTRY(maxpool_backward_ties_and_nan),
          TEST_ENTRY(cpu_dtype_size_matches), TEST_ENTRY(batchnorm2d_train), TEST_ENTRY(batchnorm2d_eval), TEST_ENTRY(relu), TEST_ENTRY(maxpool2d),
          TEST_ENTRY(avgpool2d), TEST_ENTRY(global_avgpool), TEST_ENTRY(linear), TEST_ENTRY(add), TEST_ENTRY(flatten),
          TEST_ENTRY(softmax), TEST_ENTRY(log_softmax), TEST_ENTRY(cross_entropy), TEST_ENTRY(cast),
          TEST_ENTRY(thread_counts_agree))
