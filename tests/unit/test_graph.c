/* The graph's behaviour, on the op harness's graphs (op_harness.h): the
 * effective batch, values with several consumers, gradient accumulation and
 * seeds, batch-norm running statistics, cross-entropy labels and values,
 * fusion and keep, casts of parameters, recording and backward errors, the
 * cast policy, and values in and out through the graph's I/O on every
 * backend (conversions, errors, no host pointer where memory is not host
 * memory).
 */
#include <pthread.h>

#include "op_harness.h"

/* A graph built for batch n+1 and run at effective batch n equals a graph
 * built for batch n (the data of the first n samples being the same). */
TEST(set_batch_matches_smaller_graph) {
  for (int i = 0; i < NCASES; i++)
    for (int p = 0; p < NPRECS; p++) {
      const op_case *cs = &CASES[i];
      ctx_case = cs->name;
      ctx_prec = PRECS[p].name;
      int64_t n = cs->n - 1 >= 2 ? cs->n - 1 : 2, big = n + 1;
      net a = {0}, b = {0};
      int ok = build(&a, cs, &PRECS[p].p, big, 0) == 0 && build(&b, cs, &PRECS[p].p, n, 0) == 0;
      if (ok) {
        CHECK_OK(ampc_graph_set_batch(a.g, n));
        CHECK(ampc_graph_batch(a.g) == n && ampc_graph_max_batch(a.g) == big);
        CHECK(ampc_graph_tensor(a.g, a.y).shape.d[0] == (cs->k == K_CE ? 1 : n));
        for (int r = 0; r < 2; r++) {
          net *t = r ? &b : &a;
          CHECK_OK(ampc_graph_forward(t->g, training_of(cs)));
          CHECK_OK(ampc_graph_backward(t->g, t->loss, 1.0f, 0));
        }
        snapshot sa = take_snapshot(&a, cs), sb = take_snapshot(&b, cs);
        compare_snapshots(&sa, &sb, prec_tol(&PRECS[p].p), "set_batch");
        /* back at the full batch, the graph runs the full batch again */
        CHECK_OK(ampc_graph_set_batch(a.g, big));
        CHECK_OK(ampc_graph_forward(a.g, training_of(cs)));
        CHECK(isfinite(loss_of(&a)));
      }
      ampc_graph_free(a.g);
      ampc_graph_free(b.g);
      tmp_free_all();
    }
}

TEST(set_batch_range) {
  net t;
  ctx_case = "set_batch_range";
  if (build(&t, find_case("conv3x3_s2_p1"), &PRECS[0].p, 3, 0) == 0) {
    CHECK_ERR(ampc_graph_set_batch(t.g, 0), AMPC_EINVAL, "batch");
    CHECK_ERR(ampc_graph_set_batch(t.g, 4), AMPC_EINVAL, "batch");
    CHECK(ampc_graph_batch(t.g) == 3);
  }
  ampc_graph_free(t.g);
  tmp_free_all();
}

/* set_batch before compile: the first forward runs that batch, as graph.h
 * says (compile once reset it to the built batch) */
TEST(set_batch_before_compile) {
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  const float w0[6] = {1, 2, 3, 4, 5, 6};
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(8, 3));
  ampc_value w = ampc_graph_param(g, "w", ampc_shape2(2, 3), 0, w0);
  ampc_value y = ampc_graph_linear(g, x, w, AMPC_VALUE_NONE);
  CHECK_OK(ampc_graph_keep(g, y));
  CHECK_OK(ampc_graph_set_batch(g, 3));
  CHECK(ampc_graph_batch(g) == 3);
  CHECK_OK(ampc_graph_compile(g));
  CHECK(ampc_graph_batch(g) == 3);
  CHECK(ampc_graph_max_batch(g) == 8);
  CHECK_OK(ampc_graph_forward(g, 0));
  CHECK(ampc_graph_batch(g) == 3);
  CHECK(ampc_graph_tensor(g, y).shape.d[0] == 3);
  ampc_graph_free(g);
}

/* ---------------- several consumers, accumulation, seeds ---------------- */

/* y = add(h, h): h gets both gradients (2 dy); y = add(relu(h), h) (a
 * residual): h gets dy * (h > 0) + dy. */
TEST(value_used_twice) {
  for (int p = 0; p < NPRECS; p++) {
    const ampc_graph_precision *pr = &PRECS[p].p;
    ctx_prec = PRECS[p].name;
    for (int residual = 0; residual < 2; residual++) {
      ctx_case = residual ? "add(relu(h), h)" : "add(h, h)";
      ampc_graph *g;
      CHECK_OK(ampc_graph_create(&g));
      ampc_shape s = ampc_shape4(2, 3, 5, 5);
      ampc_value x, P;
      ampc_value h = op_input(g, "x", "P", s, S_P, pr->act_type, &x, &P);
      ampc_value lab = ampc_graph_labels(g, "y", 2);
      ampc_value y = ampc_graph_add(g, residual ? ampc_graph_relu(g, h) : h, h);
      ampc_value f = ampc_graph_flatten(g, y);
      ampc_value hw = ampc_graph_param(g, "head.weight", ampc_shape2(3, 75), 0, rand_vec(S_HEAD, 225, -0.2f, 0.2f));
      ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, f, hw, AMPC_VALUE_NONE), lab, 0.0f);
      CHECK_OK(ampc_graph_set_precision(g, pr));
      ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
      CHECK_OK(ampc_graph_compile(g));
      if (ampc_graph_is_compiled(g)) {
        CHECK_OK(ampc_graph_write(g, x, rand_vec(S_X, 150, -1.0f, 1.0f), AMPC_DTYPE_F32));
        write_labels(g, lab, (const int32_t[]){1, 2});
        CHECK_OK(ampc_graph_forward(g, 1));
        CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
        double *hv = val_f64(g, h, AMPC_DTYPE_F32);
        double *dy = grad_f64(g, y, AMPC_DTYPE_F32), *ref = zeros(150), *yr = zeros(150);
        for (int i = 0; i < 150; i++) {
          ref[i] = dy[i] * (residual ? (hv[i] > 0 ? 2.0 : 1.0) : 2.0);
          yr[i] = (residual ? (hv[i] > 0 ? hv[i] : 0.0) : hv[i]) + hv[i];
        }
        ampc_tensor yt = ampc_graph_tensor(g, y), dht = ampc_graph_grad(g, h);
        check_close("forward", val_f32(g, y), yr, 150, tol_of(yt.dtype));
        check_close("grad h", grad_f32(g, h), ref, 150, tol_of(dht.dtype));
        check_close("grad P", grad_f32(g, P), ref, 150, tol_of(dht.dtype));
      }
      ampc_graph_free(g);
      tmp_free_all();
    }
  }
}

/* One weight used by two convolutions gets the sum of both gradients; with
 * accumulate = 1 a second backward adds to the first; zero_grad clears. */
TEST(shared_weight_and_accumulate) {
  for (int p = 0; p < NPRECS; p++) {
    const ampc_graph_precision *pr = &PRECS[p].p;
    ctx_prec = PRECS[p].name;
    ctx_case = "shared conv weight";
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x, P;
    ampc_value h = op_input(g, "x", "P", ampc_shape4(2, 2, 5, 5), S_P, pr->act_type, &x, &P);
    ampc_value lab = ampc_graph_labels(g, "y", 2);
    ampc_value w = ampc_graph_param(g, "w", ampc_shape4(3, 2, 3, 3), 0, rand_vec(S_W, 54, -0.4f, 0.4f));
    ampc_value b = ampc_graph_param(g, "b", ampc_shape1(3), 0, rand_vec(S_B, 3, -0.5f, 0.5f));
    ampc_value c1 = ampc_graph_conv2d(g, h, w, b, 1, 1), c2 = ampc_graph_conv2d(g, h, w, b, 1, 1);
    ampc_value y = ampc_graph_add(g, c1, c2);
    ampc_value f = ampc_graph_flatten(g, y);
    ampc_value hw = ampc_graph_param(g, "head.weight", ampc_shape2(3, 75), 0, rand_vec(S_HEAD, 225, -0.2f, 0.2f));
    ampc_value loss = ampc_graph_cross_entropy(g, ampc_graph_linear(g, f, hw, AMPC_VALUE_NONE), lab, 0.0f);
    CHECK_OK(ampc_graph_set_precision(g, pr));
    ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
    CHECK_OK(ampc_graph_compile(g));
    if (ampc_graph_is_compiled(g)) {
      CHECK_OK(ampc_graph_write(g, x, rand_vec(S_X, 100, -1.0f, 1.0f), AMPC_DTYPE_F32));
      write_labels(g, lab, (const int32_t[]){0, 2});
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
      ampc_dtype eff = pr->autocast ? pr->half_type : AMPC_DTYPE_F32;
      double *hv = val_f64(g, h, eff), *wv = val_f64(g, w, eff);
      double *bv = val_f64(g, b, eff);
      /* both convolutions see the same dy (that of y), so each gradient is twice one conv's */
      double *dy = grad_f64(g, y, AMPC_DTYPE_F32);
      double *yr = zeros(150), *dh = zeros(100), *dw = zeros(54), *db = zeros(3);
      ref_conv(hv, wv, bv, 2, 2, 5, 5, 3, 3, 1, 1, dy, yr, dh, dw, db);
      for (int i = 0; i < 100; i++) dh[i] *= 2;
      for (int i = 0; i < 54; i++) dw[i] *= 2;
      for (int i = 0; i < 3; i++) db[i] *= 2;
      ampc_tensor gw = ampc_graph_grad(g, w), yt = ampc_graph_tensor(g, y);
      double tol = prec_tol(pr);
      for (int i = 0; i < 150; i++) yr[i] *= 2;
      check_close("forward", val_f32(g, y), yr, 150, tol_of(yt.dtype));
      check_close("grad h", grad_f32(g, h), dh, 100, tol);
      check_close("grad w", grad_f32(g, w), dw, 54, tol);
      check_close("grad b", grad_f32(g, b), db, 3, tol);
      float *w1 = grad_f32(g, w), *p1 = grad_f32(g, P), *h1 = grad_f32(g, h);

      /* accumulate = 1: parameter gradients add, activation gradients do
       * not. P has one writer, so its old and new gradient are the same
       * number and the sum is exact in any type; w gets its two convolutions'
       * gradients added one at a time, rounded to its type after each. */
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 1));
      double *w2 = zeros(54), *p2 = zeros(100), *h2 = zeros(100);
      for (int i = 0; i < 54; i++) w2[i] = 2.0 * (double)w1[i];
      for (int i = 0; i < 100; i++) {
        p2[i] = 2.0 * (double)p1[i];
        h2[i] = h1[i];
      }
      ctx_case = "accumulate=1";
      check_close("grad w", grad_f32(g, w), w2, 54, tol_of(gw.dtype));
      check_close("grad P", grad_f32(g, P), p2, 100, 0.0);
      check_close("grad h", grad_f32(g, h), h2, 100, 0.0);

      /* zero_grad, then accumulate = 1 gives one backward's gradient */
      CHECK_OK(ampc_graph_zero_grad(g));
      float *z = grad_f32(g, w);
      int zero = 1;
      for (int i = 0; i < 54; i++) zero &= z[i] == 0.0f;
      CHECK(zero);
      CHECK_OK(ampc_graph_forward(g, 1));
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 1));
      double *w1d = zeros(54);
      for (int i = 0; i < 54; i++) w1d[i] = w1[i];
      ctx_case = "zero_grad + accumulate=1";
      check_close("grad w", grad_f32(g, w), w1d, 54, 0.0);

      /* accumulate = 0 overwrites again */
      CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
      ctx_case = "accumulate=0 after accumulate=1";
      check_close("grad w", grad_f32(g, w), w1d, 54, 0.0);
    }
    ampc_graph_free(g);
    tmp_free_all();
  }
}

/* The seed is d(loss), the loss scale: a power of two scales every gradient
 * exactly. */
TEST(backward_seed_scales_gradients) {
  for (int p = 0; p < NPRECS; p++) {
    ctx_prec = PRECS[p].name;
    ctx_case = "seed 8";
    net t;
    if (build(&t, find_case("conv3x3_s1_p1_bias"), &PRECS[p].p, 2, 0) == 0) {
      CHECK_OK(ampc_graph_forward(t.g, 1));
      CHECK_OK(ampc_graph_backward(t.g, t.loss, 1.0f, 0));
      float *w1 = grad_f32(t.g, t.w), *p1 = grad_f32(t.g, t.p);
      CHECK_OK(ampc_graph_backward(t.g, t.loss, 8.0f, 0));
      float *w8 = grad_f32(t.g, t.w), *p8 = grad_f32(t.g, t.p);
      size_t nw = numel_of(ampc_graph_grad(t.g, t.w)), np = numel_of(ampc_graph_grad(t.g, t.p)), bad = 0;
      for (size_t i = 0; i < nw; i++) bad += w8[i] != 8.0f * w1[i];
      for (size_t i = 0; i < np; i++) bad += p8[i] != 8.0f * p1[i];
      CHECK_MSG(bad == 0, "[%s]: %zu gradients not exactly 8x", ctx_prec, bad);
    }
    ampc_graph_free(t.g);
    tmp_free_all();
  }
}

/* ---------------- batch norm state ---------------- */

/* Two training forwards move the running statistics twice (momentum 0.1,
 * unbiased variance) and count two batches; an eval forward changes nothing. */
TEST(batchnorm_running_stats) {
  const op_case *cs = find_case("bn_train");
  ctx_case = "bn running stats";
  ctx_prec = "f32";
  CHECK(cs->k == K_BN_TRAIN);
  net t;
  if (build(&t, cs, &PRECS[0].p, cs->n, 0) == 0) {
    int64_t C = cs->c, HW = cs->h * cs->w, N = cs->n;
    double rm[8], rv[8];
    for (int64_t c = 0; c < C; c++) {
      rm[c] = urand(S_RM, (uint64_t)c, -0.3f, 0.3f);
      rv[c] = urand(S_RV, (uint64_t)c, 0.5f, 1.5f);
    }
    CHECK_OK(ampc_graph_forward(t.g, 1));
    double *x = val_f64(t.g, t.h, AMPC_DTYPE_F32); /* h is made by the forward */
    CHECK_OK(ampc_graph_forward(t.g, 1));
    for (int64_t c = 0; c < C; c++) {
      double m = 0, v = 0;
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < HW; i++) m += x[(n * C + c) * HW + i];
      m /= (double)(N * HW);
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < HW; i++) v += pow(x[(n * C + c) * HW + i] - m, 2);
      v /= (double)(N * HW - 1);
      for (int k = 0; k < 2; k++) {
        rm[c] = 0.9 * rm[c] + 0.1 * m;
        rv[c] = 0.9 * rv[c] + 0.1 * v;
      }
    }
    float *grm = val_f32(t.g, t.rm), *grv = val_f32(t.g, t.rv);
    check_close("running_mean after 2", grm, rm, (size_t)C, 1e-5);
    check_close("running_var after 2", grv, rv, (size_t)C, 1e-5);
    CHECK(read_i64(t.g, t.nbt) == 2);
    CHECK(ampc_graph_tensor(t.g, t.nbt).dtype == AMPC_DTYPE_I64);
    CHECK_OK(ampc_graph_forward(t.g, 0));
    float *erm = val_f32(t.g, t.rm), *erv = val_f32(t.g, t.rv);
    CHECK(memcmp(erm, grm, (size_t)C * sizeof(float)) == 0 && memcmp(erv, grv, (size_t)C * sizeof(float)) == 0);
    CHECK(read_i64(t.g, t.nbt) == 2);
  }
  ampc_graph_free(t.g);
  tmp_free_all();
}

/* Training normalises over N*H*W values; with one value per channel the
 * variance is undefined and PyTorch refuses ("Expected more than 1 value
 * per channel when training"). */
TEST(batchnorm_needs_two_values) {
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  float one = 1.0f;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(1, 1, 1, 1));
  ampc_value gm = ampc_graph_param(g, "g", ampc_shape1(1), 1, &one), bt = ampc_graph_param(g, "b", ampc_shape1(1), 1, NULL);
  ampc_value rm = ampc_graph_buffer(g, "rm", AMPC_DTYPE_F32, ampc_shape1(1), NULL);
  ampc_value rv = ampc_graph_buffer(g, "rv", AMPC_DTYPE_F32, ampc_shape1(1), &one);
  ampc_value y = ampc_graph_batchnorm2d(g, x, gm, bt, rm, rv, AMPC_VALUE_NONE, 0.1f, 1e-5f);
  CHECK(y >= 0);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  CHECK_ERR(ampc_graph_forward(g, 1), AMPC_EINVAL, "batchnorm2d");
  CHECK_OK(ampc_graph_forward(g, 0));
  ampc_graph_free(g);
}

/* ---------------- cross entropy ---------------- */

TEST(cross_entropy_label_out_of_range) {
  for (int bad = 0; bad < 2; bad++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x = ampc_graph_input(g, "x", ampc_shape2(3, 4));
    ampc_value lab = ampc_graph_labels(g, "y", 3);
    ampc_value loss = ampc_graph_cross_entropy(g, x, lab, 0.1f);
    CHECK(loss >= 0);
    ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
    CHECK_OK(ampc_graph_compile(g));
    int32_t l[3] = {0, bad ? -1 : 4, 3};
    write_labels(g, lab, l);
    CHECK_ERR(ampc_graph_forward(g, 1), AMPC_ERANGE, "label");
    l[1] = 1;
    write_labels(g, lab, l);
    CHECK_OK(ampc_graph_forward(g, 1));
    ampc_graph_free(g);
  }
}

/* With smoothing s the loss is (1-s) CE(one-hot) + s * mean over classes of
 * -log p; for uniform logits it is log K whatever the labels. */
TEST(cross_entropy_values) {
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(2, 5));
  ampc_value lab = ampc_graph_labels(g, "y", 2);
  ampc_value l0 = ampc_graph_cross_entropy(g, x, lab, 0.0f);
  ampc_value l1 = ampc_graph_cross_entropy(g, x, lab, 0.1f);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  float xv[10];
  for (int i = 0; i < 10; i++) xv[i] = 0.25f;
  CHECK_OK(ampc_graph_write(g, x, xv, AMPC_DTYPE_F32));
  write_labels(g, lab, (const int32_t[]){4, 0});
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK_NEAR(val_f32(g, l0)[0], log(5.0), 1e-6);
  CHECK_NEAR(val_f32(g, l1)[0], log(5.0), 1e-6);
  /* row 0 (label 4): logits 0,1,2,3,4; row 1 (label 0): 4,3,2,1,0 -> the same loss */
  for (int i = 0; i < 5; i++) {
    xv[i] = (float)i;
    xv[5 + i] = (float)(4 - i);
  }
  CHECK_OK(ampc_graph_write(g, x, xv, AMPC_DTYPE_F32));
  CHECK_OK(ampc_graph_forward(g, 1));
  double lse = log(1 + exp(1) + exp(2) + exp(3) + exp(4));
  double ce = lse - 4.0, mean_nlp = lse - 2.0;
  CHECK_NEAR(val_f32(g, l0)[0], ce, 1e-6);
  CHECK_NEAR(val_f32(g, l1)[0], 0.9 * ce + 0.1 * mean_nlp, 1e-6);
  ampc_graph_free(g);
  tmp_free_all();
}

/* ---------------- graph errors ---------------- */

static ampc_status record_and_compile(int which) {
  ampc_graph *g;
  ampc_status s = ampc_graph_create(&g);
  if (s < 0) return s;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 3, 5, 5));
  ampc_value x2 = ampc_graph_input(g, "x2", ampc_shape2(2, 7));
  ampc_value lab = ampc_graph_labels(g, "y", 2);
  ampc_value w = ampc_graph_param(g, "w", ampc_shape4(4, 2, 3, 3), 0, NULL);
  ampc_value lw = ampc_graph_param(g, "lw", ampc_shape2(3, 6), 0, NULL);
  switch (which) {
    case 0: ampc_graph_conv2d(g, x, w, AMPC_VALUE_NONE, 1, 1); break;           /* 2 vs 3 channels */
    case 1: ampc_graph_linear(g, x2, lw, AMPC_VALUE_NONE); break;               /* 6 vs 7 features */
    case 2: ampc_graph_add(g, x, ampc_graph_relu(g, x2)); break;                /* shapes differ */
    case 3: ampc_graph_cross_entropy(g, x2, x2, 0.0f); break;                  /* labels not labels */
    case 4: ampc_graph_cross_entropy(g, x2, lab, 1.5f); break;                 /* smoothing > 1 */
    case 5: ampc_graph_maxpool2d(g, x, 7, 1, 0); break;                         /* kernel > input */
    case 6: ampc_graph_input(g, "x3", ampc_shape2(3, 7)); break;                /* batch 3 vs 2 */
    case 7: ampc_graph_param(g, "w", ampc_shape1(3), 0, NULL); break;           /* duplicate name */
    case 8: ampc_graph_linear(g, x, lw, AMPC_VALUE_NONE); break;                /* 4-d into linear */
    case 9: ampc_graph_conv2d(g, x, ampc_graph_param(g, "w3", ampc_shape4(4, 3, 3, 3), 0, NULL),
                              ampc_graph_param(g, "b3", ampc_shape1(5), 0, NULL), 1, 1); break; /* bias (5) for 4 */
    default: break;
  }
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  s = ampc_graph_compile(g);
  ampc_graph_free(g);
  return s;
}

TEST(recording_errors) {
  const char *const expect[] = {"channels", "features", "shapes", "labels", "label_smoothing",
                                "kernel", "batch", "duplicate", "2-d", "bias"};
  for (int i = 0; i < 10; i++) CHECK_ERR(record_and_compile(i), AMPC_EINVAL, expect[i]);
  CHECK_OK(record_and_compile(-1));
}

/* a window larger than the padded input but by less than the stride: C's
 * division gave one output position (torch refuses these) */
TEST(window_past_padded_input) {
  for (int i = 0; i < 3; i++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x = ampc_graph_input(g, "x", ampc_shape4(1, 1, 2, 2));
    if (i == 0) ampc_graph_maxpool2d(g, x, 3, 2, 0);
    if (i == 1) ampc_graph_conv2d(g, x, ampc_graph_param(g, "w", ampc_shape4(1, 1, 3, 3), 0, NULL), AMPC_VALUE_NONE, 2, 0);
    if (i == 2) ampc_graph_conv2d(g, x, ampc_graph_param(g, "w", ampc_shape4(1, 1, 5, 5), 0, NULL), AMPC_VALUE_NONE, 3, 1);
    CHECK_ERR(ampc_graph_compile(g), AMPC_EINVAL, "larger than");
    ampc_graph_free(g);
  }
}

/* A graph recorded with an error on one thread */
static void *record_bad(void *arg) {
  ampc_graph *g = arg;
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 3, 8, 8));
  ampc_graph_maxpool2d(g, x, 0, 1, 0);
  return NULL;
}

/* compile (and what compiles: forward) says the first recording error's
 * message, whatever failed since on this thread and wherever it was
 * recorded (it returned the code with another call's message, or none) */
TEST(recording_error_message_kept) {
  for (int other_thread = 0; other_thread < 2; other_thread++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    if (other_thread) {
      pthread_t t;
      CHECK(pthread_create(&t, NULL, record_bad, g) == 0);
      pthread_join(t, NULL);
    } else {
      record_bad(g);
    }
    ampc_dtype dt;
    CHECK(ampc_dtype_parse("f8", &dt) < 0); /* another call fails since */
    CHECK_ERR(ampc_graph_compile(g), AMPC_EINVAL, "graph: maxpool2d: kernel 0");
    ampc_clear_error();
    CHECK_ERR(ampc_graph_forward(g, 1), AMPC_EINVAL, "graph: maxpool2d: kernel 0");
    ampc_clear_error();
    CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "graph: maxpool2d: kernel 0");
    ampc_graph_free(g);
  }
}

TEST(backward_errors) {
  net t;
  ctx_case = "backward_errors";
  ctx_prec = "f32";
  if (build(&t, find_case("relu"), &PRECS[0].p, 2, 0) == 0) {
    CHECK_OK(ampc_graph_forward(t.g, 1));
    CHECK_ERR(ampc_graph_backward(t.g, t.y, 1.0f, 0), AMPC_EINVAL, "loss");
    CHECK_ERR(ampc_graph_backward(t.g, 12345, 1.0f, 0), AMPC_EINVAL, "loss");
    CHECK_OK(ampc_graph_backward(t.g, t.loss, 1.0f, 0));
  }
  ampc_graph_free(t.g);
  tmp_free_all();
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape2(2, 3));
  ampc_value loss = ampc_graph_cross_entropy(g, x, ampc_graph_labels(g, "y", 2), 0.0f);
  CHECK_ERR(ampc_graph_backward(g, loss, 1.0f, 0), AMPC_ESTATE, "before");
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  CHECK_ERR(ampc_graph_set_precision(g, &PRECS[1].p), AMPC_ESTATE, "before compile");
  /* compiled but not run forward: nothing saved for backward */
  CHECK_ERR(ampc_graph_backward(g, loss, 1.0f, 0), AMPC_ESTATE, "backward before forward");
  float xs[6] = {0};
  int32_t ys[2] = {0, 1};
  CHECK_ERR(ampc_graph_write(g, x, NULL, AMPC_DTYPE_F32), AMPC_EINVAL, "the source is NULL");
  CHECK_ERR(ampc_graph_read(g, x, NULL, AMPC_DTYPE_F32), AMPC_EINVAL, "the destination is NULL");
  CHECK_OK(ampc_graph_write(g, x, xs, AMPC_DTYPE_F32));
  CHECK_OK(ampc_graph_write(g, ampc_graph_find(g, "y"), ys, AMPC_DTYPE_I32));
  CHECK_OK(ampc_graph_forward(g, 1));
  CHECK_OK(ampc_graph_backward(g, loss, 1.0f, 0));
  ampc_graph_free(g);
  ampc_graph_free(NULL);
}

/* A NULL graph, shapes past 4 dimensions or past int64's element count:
 * errors, never a crash. */
TEST(api_misuse) {
  CHECK_ERR(ampc_graph_create(NULL), AMPC_EINVAL, "out is NULL");
  CHECK_ERR(ampc_graph_status(NULL), AMPC_EINVAL, "the graph is NULL");
  CHECK_ERR(ampc_graph_compile(NULL), AMPC_EINVAL, "ampc_graph_compile: the graph is NULL");
  CHECK_ERR(ampc_graph_forward(NULL, 1), AMPC_EINVAL, "the graph is NULL");
  CHECK_ERR(ampc_graph_backward(NULL, 0, 1.0f, 0), AMPC_EINVAL, "the graph is NULL");
  CHECK_ERR(ampc_graph_write(NULL, 0, NULL, AMPC_DTYPE_F32), AMPC_EINVAL, "the graph is NULL");
  CHECK(ampc_graph_input(NULL, "x", ampc_shape2(2, 3)) == AMPC_VALUE_NONE);
  CHECK(ampc_graph_name(NULL, 0) == NULL && ampc_graph_param_count(NULL) == 0 && ampc_graph_batch(NULL) == 0);
  CHECK(ampc_graph_tensor(NULL, 0).data == NULL && ampc_graph_find(NULL, "x") == AMPC_VALUE_NONE);
  ampc_mem_report r;
  memset(&r, 0xff, sizeof r);
  ampc_graph_memory(NULL, &r);
  CHECK(ampc_mem_total(&r, AMPC_MEM_ACTIVATIONS) == 0);
  char buf[64];
  ampc_shape bad = {7, {1, 2, 3, 4}};
  CHECK(strcmp(ampc_shape_str(&bad, buf, sizeof buf), "(1, 2, 3, 4)") == 0);
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  CHECK(ampc_graph_input(g, "x", bad) == AMPC_VALUE_NONE);
  CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "7 dimensions (at most 4)");
  ampc_graph_free(g);
  CHECK_OK(ampc_graph_create(&g));
  CHECK(ampc_graph_labels(g, "y", INT64_MAX) == AMPC_VALUE_NONE);
  CHECK_ERR(ampc_graph_compile(g), AMPC_EINVAL, "too many elements");
  ampc_graph_free(g);
  CHECK_OK(ampc_graph_create(&g));
  CHECK(ampc_graph_input(g, "x", ampc_shape4(1 << 20, 1 << 20, 1 << 20, 1 << 20)) == AMPC_VALUE_NONE);
  CHECK_ERR(ampc_graph_status(g), AMPC_EINVAL, "too many elements");
  ampc_graph_free(g);
}



/* A kept batch-norm output keeps its own values: the ReLU after it is not
 * fused into it (fused, the two would share memory holding the ReLU's). */
TEST(keep_stops_relu_fusion) {
  for (int keep = 0; keep < 2; keep++) {
    ampc_graph *g;
    CHECK_OK(ampc_graph_create(&g));
    ampc_value x = ampc_graph_input(g, "x", ampc_shape4(2, 3, 4, 4));
    static const float ones[3] = {1.0f, 1.0f, 1.0f};
    ampc_value gm = ampc_graph_param(g, "bn.weight", ampc_shape1(3), 1, ones);
    ampc_value bt = ampc_graph_param(g, "bn.bias", ampc_shape1(3), 1, NULL);
    ampc_value rm = ampc_graph_buffer(g, "bn.running_mean", AMPC_DTYPE_F32, ampc_shape1(3), NULL);
    ampc_value rv = ampc_graph_buffer(g, "bn.running_var", AMPC_DTYPE_F32, ampc_shape1(3), ones);
    ampc_value bn = ampc_graph_batchnorm2d(g, x, gm, bt, rm, rv, AMPC_VALUE_NONE, 0.1f, 1e-5f);
    ampc_value r = ampc_graph_relu(g, bn);
    ampc_value hw = ampc_graph_param(g, "head", ampc_shape2(2, 48), 0, rand_vec(S_HEAD, 96, -0.2f, 0.2f));
    ampc_value lab = ampc_graph_labels(g, "y", 2);
    ampc_graph_cross_entropy(g, ampc_graph_linear(g, ampc_graph_flatten(g, r), hw, AMPC_VALUE_NONE), lab, 0.0f);
    if (keep) CHECK_OK(ampc_graph_keep(g, bn));
    CHECK_OK(ampc_graph_compile(g));
    if (ampc_graph_is_compiled(g)) {
      CHECK_OK(ampc_graph_write(g, x, rand_vec(S_X, 96, -1.0f, 1.0f), AMPC_DTYPE_F32));
      CHECK_OK(ampc_graph_forward(g, 1));
      /* fused, the batch norm's memory holds the ReLU's output: no negative values */
      const float *b = val_f32(g, bn), *y = val_f32(g, r);
      int negative = 0, differ = 0;
      for (int i = 0; i < 96; i++) {
        negative += b[i] < 0.0f;
        differ += b[i] != y[i];
      }
      CHECK_MSG(keep ? (differ > 0 && negative > 0) : (differ == 0 && negative == 0),
                "keep %d: batch norm output has %d negative values, %d differ from the ReLU's", keep, negative, differ);
    }
    ampc_graph_free(g);
    tmp_free_all();
  }
}

/* An explicit cast of a parameter (a weight kept in f32 and cast by the
 * model itself) is not batched: the convolution must see the whole weight
 * (4 output channels) at the built batch (3) and at a smaller one (2). */
TEST(cast_of_param) {
  ctx_case = "conv(x, cast(w))";
  ctx_prec = "f32";
  ampc_graph *g;
  CHECK_OK(ampc_graph_create(&g));
  ampc_value x = ampc_graph_input(g, "x", ampc_shape4(3, 2, 5, 5));
  ampc_value w = ampc_graph_param(g, "w", ampc_shape4(4, 2, 3, 3), 0, rand_vec(S_W, 72, -0.4f, 0.4f));
  ampc_value wc = ampc_graph_cast(g, w, AMPC_DTYPE_F32);
  ampc_value y = ampc_graph_conv2d(g, x, wc, AMPC_VALUE_NONE, 1, 1);
  ampc_value lab = ampc_graph_labels(g, "y", 3);
  ampc_graph_cross_entropy(g, ampc_graph_global_avgpool(g, y), lab, 0.0f);
  ampc_graph_set_retain_grads(g, 1); /* the checks read activation gradients */
  CHECK_OK(ampc_graph_compile(g));
  if (ampc_graph_is_compiled(g)) {
    CHECK_OK(ampc_graph_write(g, x, rand_vec(S_X, 150, -1.0f, 1.0f), AMPC_DTYPE_F32));
    write_labels(g, lab, (const int32_t[]){0, 1, 2});
    for (int64_t n = 3; n >= 2; n--) {
      CHECK_OK(ampc_graph_set_batch(g, n));
      CHECK_OK(ampc_graph_forward(g, 1));
      ampc_tensor wt = ampc_graph_tensor(g, wc);
      CHECK_MSG(wt.shape.d[0] == 4, "batch %lld: cast of the weight has shape[0] = %lld, expected 4", (long long)n,
                (long long)wt.shape.d[0]);
      double *yr = zeros((size_t)(n * 100));
      ref_conv(val_f64(g, x, AMPC_DTYPE_F32), val_f64(g, w, AMPC_DTYPE_F32), NULL,
               n, 2, 5, 5, 4, 3, 1, 1, NULL, yr, NULL, NULL, NULL);
      check_close(n == 3 ? "conv output, batch 3" : "conv output, batch 2", val_f32(g, y), yr,
                  (size_t)(n * 100), 1e-5);
    }
  }
  ampc_graph_free(g);
  tmp_free_all();
}

TEST(op_names_and_policies) {
  CHECK(strcmp(ampc_op_name(AMPC_OP_CONV2D), "conv2d") == 0);
  CHECK(strcmp(ampc_op_name(AMPC_OP_CROSS_ENTROPY), "cross_entropy") == 0);
  CHECK(strcmp(ampc_op_name(AMPC_OP_COUNT), "?") == 0);
  CHECK(ampc_amp_cast_policy(AMPC_OP_CONV2D) == AMPC_CAST_POLICY_HALF);
  CHECK(ampc_amp_cast_policy(AMPC_OP_LINEAR) == AMPC_CAST_POLICY_HALF);
  CHECK(ampc_amp_cast_policy(AMPC_OP_BATCHNORM2D) == AMPC_CAST_POLICY_FP32);
  CHECK(ampc_amp_cast_policy(AMPC_OP_SOFTMAX) == AMPC_CAST_POLICY_FP32);
  CHECK(ampc_amp_cast_policy(AMPC_OP_ADD) == AMPC_CAST_POLICY_PROMOTE);
  CHECK(ampc_amp_cast_policy(AMPC_OP_RELU) == AMPC_CAST_POLICY_KEEP);
}

TEST_MAIN(TEST_ENTRY(set_batch_matches_smaller_graph), TEST_ENTRY(set_batch_range), TEST_ENTRY(set_batch_before_compile), TEST_ENTRY(window_past_padded_input), TEST_ENTRY(value_used_twice),
          TEST_ENTRY(shared_weight_and_accumulate), TEST_ENTRY(backward_seed_scales_gradients),
          TEST_ENTRY(batchnorm_running_stats), TEST_ENTRY(batchnorm_needs_two_values),
          TEST_ENTRY(cross_entropy_label_out_of_range), TEST_ENTRY(cross_entropy_values), TEST_ENTRY(recording_errors), TEST_ENTRY(recording_error_message_kept),
          TEST_ENTRY(backward_errors), TEST_ENTRY(keep_stops_relu_fusion), TEST_ENTRY(cast_of_param),
          TEST_ENTRY(op_names_and_policies), TEST_ENTRY(api_misuse))
