/* ampc grad: one training-mode forward and backward on a given batch, with
 * given weights; writes loss, logits and the unscaled f32 gradient of every
 * parameter, so they can be checked against another framework. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

/* Which parameter's gradient is not finite, and at what scale. */
static void grad_warn_nonfinite(cli_session *s, const float *grads, const ampc_scaler *sc, float loss) {
  size_t np = ampc_graph_param_count(s->g);
  for (size_t i = 0; i < np; i++) {
    ampc_value v = ampc_graph_param_at(s->g, i);
    ampc_tensor t = ampc_graph_tensor(s->g, v);
    const float *p = grads + ampc_graph_param_offset(s->g, v);
    size_t n = (size_t)ampc_tensor_numel(&t), bad = 0;
    for (size_t k = 0; k < n; k++) bad += !isfinite(p[k]);
    if (!bad) continue;
    fprintf(stderr, "ampc: warning: grad: %zu non-finite values in the gradient of %s at loss scale %g (%s)\n", bad,
            ampc_graph_name(s->g, v), (double)ampc_scaler_scale(sc),
            !isfinite(loss) ? "the loss is not finite: the forward pass overflowed or met a NaN"
            : sc->dynamic   ? "no smaller scale helped"
                            : "the gradient itself is not finite");
    return;
  }
}

int cmd_grad(int argc, char **argv) {
  cli_common c;
  cli_common_defaults(&c);
  const char *weights = NULL, *batch = NULL, *out = NULL;
  int classes = 10;
  cli_opt opts[48];
  int n = cli_common_opts(&c, opts, CLI_OPTS_PRECISION);
  opts[n++] = (cli_opt){"--weights", OPT_STRING, &weights, "FILE", "weights or checkpoint (safetensors), required", 0, NULL};
  opts[n++] = (cli_opt){"--batch", OPT_STRING, &batch, "FILE", "safetensors with x (f32 N,C,H,W) and y (integer labels), required", 0, NULL};
  opts[n++] = (cli_opt){"--out", OPT_STRING, &out, "FILE", "where to write loss, logits and grad.<name>, required", 0, NULL};
  opts[n++] = (cli_opt){"--classes", OPT_INT, &classes, "N", "classes of the model, 2.." CLI_STR(CLI_MAX_CLASSES) " (default 10)", 2, NULL};
  opts[n] = (cli_opt){0};
  int pr = cli_parse("grad", "--model M --weights W --batch B --out OUT [options]", opts, argc, argv);
  if (pr) return pr > 0 ? 0 : 2;
  if (!weights || !batch || !out) {
    cli_error("grad: --weights, --batch and --out are required");
    return 2;
  }
  if (cli_not_stdout("--out", out) < 0) return 2;
  if (cli_same_file(out, weights) || cli_same_file(out, batch)) {
    cli_error("--out: '%s' is the %s file it reads; choose another output", out, cli_same_file(out, weights) ? "--weights" : "--batch");
    return 2;
  }
  ampc_amp_config acfg;
  int cc = cli_common_check(&c, &acfg);
  if (cc < 0) return cc == -2 ? 1 : 2;
  ampc_st_file *bf;
  if (ampc_st_open(&bf, batch) < 0) {
    cli_lib_error("--batch");
    return 1;
  }
  const ampc_st_tensor *x = ampc_st_find(bf, "x"), *y = ampc_st_find(bf, "y");
  int shape[4];
  int64_t nb;
  char from[4200];
  snprintf(from, sizeof from, "the batch %s with --classes %d", batch, classes);
  if (cli_check_batch(batch, x, y, classes, shape, &nb) < 0 || cli_check_weights_input("--weights", weights, c.model, shape[0], shape[1], shape[2], classes, from) < 0) {
    ampc_st_close(bf);
    return 1;
  }
  cli_session s;
  int rc = 0;
  if (cli_session_open(&s, &c, 0, 0, shape, NULL, nb, NULL, NULL) < 0) rc = 1;
  if (!rc) snprintf(s.shape_from, sizeof s.shape_from, "%s", from);
  if (!rc && cli_load_weights(&s, weights) < 0) rc = 1;
  float *xf = NULL, *grads = NULL, *logits = NULL;
  int32_t *yi = NULL;
  if (!rc) {
    ampc_tensor xt = ampc_graph_tensor(s.g, ampc_model_input(s.model));
    size_t nx = (size_t)ampc_tensor_numel(&xt);
    xf = malloc(nx * sizeof *xf);
    yi = malloc((size_t)y->shape[0] * sizeof *yi);
    if (!xf || !yi || ampc_st_read_f32(x, xf, nx) < 0 || ampc_st_read_i32(y, yi, (size_t)y->shape[0]) < 0) {
      cli_lib_error(batch);
      rc = 1;
    }
    /* a NaN or inf image gives NaN gradients, whatever the scale: refused */
    for (size_t i = 0; !rc && i < nx; i++)
      if (!isfinite(xf[i])) {
        cli_error("%s: x holds a non-finite value (%g at element %zu)", batch, (double)xf[i], i);
        rc = 1;
      }
    for (int64_t i = 0; !rc && i < y->shape[0]; i++)
      if (yi[i] < 0 || yi[i] >= classes) {
        cli_error("%s: label %d of sample %lld out of range for %d classes (--classes)", batch, (int)yi[i], (long long)i, classes);
        rc = 1;
      }
    if (!rc && (ampc_graph_write(s.g, ampc_model_input(s.model), xf, AMPC_DTYPE_F32) < 0 ||
                ampc_graph_write(s.g, ampc_model_labels(s.model), yi, AMPC_DTYPE_I32) < 0)) {
      cli_lib_error(batch);
      rc = 1;
    }
  }
  size_t numel = 0, np = 0;
  int nonfinite = 0;
  ampc_scaler *sc = NULL;
  if (!rc) {
    numel = ampc_graph_param_numel(s.g);
    np = ampc_graph_param_count(s.g);
    sc = ampc_amp_scaler(s.amp, 0);
    grads = malloc((numel ? numel : 1) * sizeof *grads);
    if (!grads) {
      cli_error("out of memory");
      rc = 1;
    }
  }
  /* as a training step's dynamic scale backs off after an overflow, a
   * dynamic scale (O1, O2) is halved until the 16-bit backward no longer
   * overflows: the gradients written are the unscaled ones of the first
   * scale that fits. A loss that is not finite itself ends it at once (no
   * scale helps), and so do 32 halvings (2^16 down to 2^-16). */
  for (int tries = 0; !rc; tries++) {
    float l = 0.0f;
    if (ampc_amp_forward(s.amp, 1) < 0 || ampc_amp_backward(s.amp, ampc_model_loss(s.model), 0, 0) < 0 ||
        ampc_amp_unscaled_grads(s.amp, grads, &nonfinite) < 0 ||
        ampc_graph_read(s.g, ampc_model_loss(s.model), &l, AMPC_DTYPE_F32) < 0) {
      cli_lib_error(NULL);
      rc = 1;
      break;
    }
    float scale = ampc_scaler_scale(sc);
    if (!nonfinite || !isfinite(l) || !sc->dynamic || tries >= 32 || scale * 0.5f < sc->min_scale) break;
    ampc_scaler_state st;
    ampc_scaler_get_state(sc, &st);
    st.scale = scale * 0.5f;
    if (ampc_scaler_set_state(sc, &st) < 0) break;
  }
  if (!rc) {
    ampc_tensor lg = ampc_graph_tensor(s.g, ampc_model_logits(s.model));
    size_t nl = (size_t)ampc_tensor_numel(&lg);
    logits = malloc(nl * sizeof *logits);
    ampc_st_tensor *ts = calloc(np + 2, sizeof *ts);
    char **names = calloc(np, sizeof *names);
    float loss = 0.0f;
    if (!logits || !ts || !names) {
      cli_error("out of memory");
      rc = 1;
    } else if (ampc_graph_read(s.g, ampc_model_logits(s.model), logits, AMPC_DTYPE_F32) < 0 ||
               ampc_graph_read(s.g, ampc_model_loss(s.model), &loss, AMPC_DTYPE_F32) < 0) {
      cli_lib_error(NULL);
      rc = 1;
    } else {
      if (nonfinite) grad_warn_nonfinite(&s, grads, sc, loss);
      ts[0] = (ampc_st_tensor){.name = "loss", .dtype = AMPC_DTYPE_F32, .ndim = 0, .values = &loss, .nbytes = 4};
      ts[1] = (ampc_st_tensor){.name = "logits", .dtype = AMPC_DTYPE_F32, .ndim = 2, .shape = {lg.shape.d[0], lg.shape.d[1]}, .values = logits, .nbytes = nl * 4};
      for (size_t i = 0; i < np && !rc; i++) {
        ampc_value v = ampc_graph_param_at(s.g, i);
        ampc_tensor t = ampc_graph_tensor(s.g, v);
        size_t len = strlen(ampc_graph_name(s.g, v)) + 6;
        names[i] = malloc(len);
        if (!names[i]) {
          rc = 1;
          break;
        }
        snprintf(names[i], len, "grad.%s", ampc_graph_name(s.g, v));
        ampc_st_tensor *o = &ts[2 + i];
        o->name = names[i];
        o->dtype = AMPC_DTYPE_F32;
        o->ndim = t.shape.ndim;
        for (int d = 0; d < t.shape.ndim; d++) o->shape[d] = t.shape.d[d];
        o->values = grads + ampc_graph_param_offset(s.g, v);
        o->nbytes = (size_t)ampc_tensor_numel(&t) * 4;
      }
      const char *meta[] = {"model", c.model, "opt_level", c.opt_level, "half", c.half, NULL};
      if (!rc && ampc_st_write(out, ts, np + 2, meta) < 0) {
        cli_lib_error("--out");
        rc = 1;
      }
      if (!rc) printf("loss %.6f, %zu gradients written to %s (loss scale %g)\n", loss, np, out, (double)ampc_scaler_scale(sc));
    }
    if (names)
      for (size_t i = 0; i < np; i++) free(names[i]);
    free(names);
    free(ts);
  }
  free(xf);
  free(yi);
  free(grads);
  free(logits);
  ampc_st_close(bf);
  cli_session_close(&s);
  return rc;
}
