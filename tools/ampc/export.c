/* ampc export: a checkpoint's (or weights file's) model as a PyTorch
 * state_dict in one safetensors file.
 *
 * Every tensor of the input except "master.*" and "optim.*" is written under
 * its own (PyTorch) name; a parameter whose f32 master copy the checkpoint
 * holds ("master.<name>") is written from that copy, the exact weights, rather
 * than from the 16-bit model copy. Floating-point tensors are converted to
 * --dtype; integer buffers (num_batches_tracked) keep their type, and a value
 * the type cannot hold is refused, not written as inf. The model is built
 * from the file's own metadata (its name, input shape and classes), only to
 * check that the file holds all of its tensors and no others: this needs
 * neither the data nor the model's shapes. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/checkpoint.h"
#include "ampc/nn.h"
#include "ampc/safetensors.h"
#include "ampc/version.h"
#include "cli.h"
#include "session.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ampc export CHECKPOINT -o FILE [--dtype f32|f16|bf16]\n\n"
          "Writes the model's state_dict from a checkpoint (or a --save weights file) as a\n"
          "safetensors file that PyTorch's load_state_dict(strict=True) takes: parameters and\n"
          "buffers under their PyTorch names, each parameter from its f32 master copy where the\n"
          "checkpoint has one, no optimizer state. The preprocessing the model was trained with\n"
          "(dataset, per-channel mean and std) goes into the file's metadata.\n\n"
          "options:\n"
          "  -o, --output FILE             the safetensors file to write (required)\n"
          "  --dtype f32|f16|bf16          type of the floating-point tensors (default f32;\n"
          "                                integer buffers stay integers)\n"
          "  --help                        show this help\n");
}

static int is_prefixed(const char *name) { return strncmp(name, "master.", 7) == 0 || strncmp(name, "optim.", 6) == 0; }

static int same_shape(const ampc_st_tensor *a, const ampc_st_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* Every parameter and buffer of the model the file names, built for the input
 * shape and classes it records, is in the file under its name with its shape,
 * and no other model tensor is: what PyTorch's load_state_dict(strict=True)
 * asks of the export. A file that records no model or no input shape is
 * passed over (nothing to check it against). Prints the error, returns -1. */
/* masters: the file holds f32 master copies (or says it was saved with
 * them), so every parameter must have one: the model copy of one whose
 * master is missing is not its exact value */
static int check_complete(const char *in, const ampc_st_file *f, const char *model, int masters) {
  int c, h, w, k;
  ampc_status st = ampc_checkpoint_input(f, &c, &h, &w, &k);
  if (st < 0) {
    cli_lib_error(NULL);
    return -1;
  }
  if (!model || st == 0) return 0;
  if (!ampc_model_known(model)) {
    cli_error("%s: saved from model '%.60s', which this ampc does not know (expected one of: %s)", in, model, ampc_model_names());
    return -1;
  }
  ampc_model_opts mo = {.batch = 1, .channels = c, .height = h, .width = w, .classes = k};
  ampc_model *m;
  if (ampc_model_create(&m, model, &mo) < 0) {
    cli_lib_error(in);
    return -1;
  }
  ampc_graph *g = ampc_model_graph(m);
  size_t np = ampc_graph_param_count(g), nb = ampc_graph_buffer_count(g);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < np + nb; i++) {
    ampc_value v = i < np ? ampc_graph_param_at(g, i) : ampc_graph_buffer_at(g, i - np);
    const char *name = ampc_graph_name(g, v);
    ampc_tensor tv = ampc_graph_tensor(g, v);
    const ampc_st_tensor *t = ampc_st_find(f, name);
    int same = t && t->ndim == tv.shape.ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == tv.shape.d[d];
    char mname[512];
    snprintf(mname, sizeof mname, "master.%s", name);
    if (!t) {
      cli_error("%s: missing tensor '%s' of model %s (PyTorch's strict load_state_dict would refuse the export)", in, name, model);
      rc = -1;
    } else if (masters && i < np && !ampc_st_find(f, mname)) {
      cli_error("%s: missing tensor '%s' (the f32 master copy of '%s'; the checkpoint holds master weights)", in, mname, name);
      rc = -1;
    } else if (ampc_dtype_is_float(t->dtype) != ampc_dtype_is_float(tv.dtype)) {
      cli_error("%s: tensor '%s' is %s, but model %s's is %s", in, name, ampc_dtype_name(t->dtype), model,
                ampc_dtype_is_float(tv.dtype) ? "a float tensor" : "an integer tensor");
      rc = -1;
    } else if (!same) {
      char have[96], want[96];
      cli_error("%s: tensor '%s' is %s, but model %s (for %dx%dx%d inputs and %d classes) has %s", in, name, cli_st_shape(t, have, sizeof have),
                model, c, h, w, k, ampc_shape_str(&tv.shape, want, sizeof want));
      rc = -1;
    }
  }
  for (size_t i = 0; rc == 0 && i < ampc_st_count(f); i++) {
    const char *name = ampc_st_get(f, i)->name;
    if (is_prefixed(name)) continue;
    int found = 0;
    for (size_t j = 0; !found && j < np + nb; j++)
      found = strcmp(name, ampc_graph_name(g, j < np ? ampc_graph_param_at(g, j) : ampc_graph_buffer_at(g, j - np))) == 0;
    if (!found) {
      cli_error("%s: unexpected tensor '%.200s' for model %s (PyTorch's strict load_state_dict would refuse the export)", in, name, model);
      rc = -1;
    }
  }
  ampc_model_free(m);
  return rc;
}

/* The first finite value of x (n of them) that dt cannot hold (it would be
 * written as inf), or -1 when there is none. */
static ptrdiff_t first_out_of_range(ampc_dtype dt, const void *converted, const float *x, size_t n) {
  if (dt == AMPC_DTYPE_F32) return -1;
  const uint16_t *h = converted;
  for (size_t i = 0; i < n; i++) {
    float back = dt == AMPC_DTYPE_F16 ? ampc_f16_to_f32(h[i]) : ampc_bf16_to_f32(h[i]);
    if (isfinite(x[i]) && !isfinite(back)) return (ptrdiff_t)i;
  }
  return -1;
}

int cmd_export(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *dtype_name = "f32";
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    const char **dest = NULL;
    const char *v = NULL;
    if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0 || strncmp(a, "--output=", 9) == 0) {
      dest = &out;
      v = a[1] == '-' && a[8] == '=' ? a + 9 : NULL;
    } else if (strcmp(a, "--dtype") == 0 || strncmp(a, "--dtype=", 8) == 0) {
      dest = &dtype_name;
      v = a[7] == '=' ? a + 8 : NULL;
    }
    if (dest) {
      if (!v) v = i + 1 < argc ? argv[++i] : NULL;
      if (!v || !*v) {
        cli_error("export: %s: %s value", a, v ? "empty" : "missing");
        return 2;
      }
      *dest = v;
    } else if (a[0] == '-' && a[1]) {
      cli_error("export: unknown option '%s' (see ampc export --help)", a);
      return 2;
    } else if (in) {
      cli_error("export: one input file only; got '%s' and '%s'", in, a);
      return 2;
    } else {
      in = a;
    }
  }
  if (!in || !out) {
    cli_error("export: %s (usage: ampc export CHECKPOINT -o FILE [--dtype f32|f16|bf16])", !in ? "no checkpoint given" : "-o FILE is required");
    return 2;
  }
  ampc_dtype dt;
  if (ampc_dtype_parse(dtype_name, &dt) < 0 || (dt != AMPC_DTYPE_F32 && dt != AMPC_DTYPE_F16 && dt != AMPC_DTYPE_BF16)) {
    cli_error("--dtype: expected f32, f16 or bf16, got '%s'", dtype_name);
    return 2;
  }
  if (cli_not_stdout("-o", out) < 0) return 2;
  if (cli_same_file(in, out)) {
    cli_error("-o: '%s' is the input file; write the export to another file", out);
    return 2;
  }

  ampc_st_file *f;
  if (ampc_st_open(&f, in) < 0) {
    cli_lib_error(NULL);
    return 1;
  }
  int rc = 0;
  /* what the input says about itself */
  const char *fmt = ampc_st_metadata(f, "format"), *model = ampc_st_metadata(f, "model");
  json_t *info = NULL, *pre = NULL;
  if (fmt && strncmp(fmt, "ampc-weights-", 13) == 0 && strcmp(fmt, "ampc-weights-1") != 0) {
    cli_error("%s: weights format '%.60s', this ampc reads ampc-weights-1", in, fmt);
    ampc_st_close(f);
    return 1;
  }
  if (!fmt || (strcmp(fmt, "ampc-checkpoint") != 0 && strncmp(fmt, "ampc-weights-", 13) != 0)) {
    /* grad's outputs and inputs, exports and other frameworks' files are safetensors too */
    if (fmt)
      cli_error("%s: not an ampc checkpoint or weights file (its \"format\" metadata is '%.60s')", in, fmt);
    else
      cli_error("%s: not an ampc checkpoint or weights file (no \"format\" metadata)", in);
    ampc_st_close(f);
    return 1;
  }
  if (strcmp(fmt, "ampc-checkpoint") == 0) {
    json_error_t je;
    const char *js = ampc_st_metadata(f, "ampc");
    info = js ? json_loads(js, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!json_is_object(info)) {
      cli_error("%s: the checkpoint's \"ampc\" metadata is %s", in, js ? "not a JSON object" : "missing");
      json_decref(info);
      ampc_st_close(f);
      return 1;
    }
    model = json_string_value(json_object_get(info, "model"));
  }
  /* the export must load as the model's whole state_dict, and say soundly how its inputs are made */
  int masters = json_integer_value(json_object_get(json_object_get(info, "amp"), "master_weights")) == 1;
  for (size_t i = 0; i < ampc_st_count(f); i++)
    if (strncmp(ampc_st_get(f, i)->name, "master.", 7) == 0) masters = 1;
  if (cli_file_preprocessing(f, "export", in, &pre) < 0 || check_complete(in, f, model, masters) < 0) {
    json_decref(info);
    json_decref(pre);
    ampc_st_close(f);
    return 1;
  }

  size_t n = ampc_st_count(f), nout = 0, from_master = 0;
  ampc_st_tensor *t = calloc(n ? n : 1, sizeof *t);
  void **bufs = calloc(n ? n : 1, sizeof *bufs);
  int64_t values = 0;
  if (!t || !bufs) {
    cli_error("export: out of memory");
    rc = 1;
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const ampc_st_tensor *m = ampc_st_get(f, i);
    if (is_prefixed(m->name)) continue;
    char mname[512];
    snprintf(mname, sizeof mname, "master.%s", m->name);
    const ampc_st_tensor *src = ampc_st_find(f, mname);
    if (src && ampc_dtype_is_float(src->dtype) != ampc_dtype_is_float(m->dtype)) {
      cli_error("%s: '%s' is %s but '%s' is %s", in, mname, ampc_dtype_name(src->dtype), m->name, ampc_dtype_name(m->dtype));
      rc = 1;
      break;
    }
    if (src && !same_shape(src, m)) {
      cli_error("%s: '%s' and '%s' differ in shape", in, mname, m->name);
      rc = 1;
      break;
    }
    if (src) from_master++;
    else src = m;
    ampc_st_tensor *o = &t[nout++];
    *o = *src;
    o->name = m->name;
    int64_t numel = ampc_st_numel(src);
    values += numel;
    if (!ampc_dtype_is_float(src->dtype)) continue; /* integers as saved */
    size_t ne = (size_t)numel;
    float *tmp = malloc((ne ? ne : 1) * sizeof *tmp);
    void *dst = malloc((ne ? ne : 1) * ampc_dtype_size(dt));
    if (!tmp || !dst) {
      free(tmp);
      free(dst);
      cli_error("export: out of memory");
      rc = 1;
      break;
    }
    bufs[i] = dst;
    if (ampc_st_read_f32(src, tmp, ne) < 0) {
      free(tmp);
      cli_lib_error(in);
      rc = 1;
      break;
    }
    ampc_store_f32(dt, dst, tmp, ne);
    ptrdiff_t bad = first_out_of_range(dt, dst, tmp, ne);
    if (bad >= 0) {
      /* the largest magnitude, to say how far out of range the tensor goes */
      float most = 0.0f;
      for (size_t j = 0; j < ne; j++)
        if (isfinite(tmp[j]) && fabsf(tmp[j]) > most) most = fabsf(tmp[j]);
      cli_error("%s: tensor '%s' has values up to %g in magnitude (element %td), beyond %s's range (largest %s): they would be written "
                "as inf; export with --dtype %s", in, m->name, (double)most, bad, ampc_dtype_name(dt),
                dt == AMPC_DTYPE_F16 ? "65504" : "3.39e+38", dt == AMPC_DTYPE_F16 ? "f32 or bf16" : "f32");
      free(tmp);
      rc = 1;
      break;
    }
    free(tmp);
    o->dtype = dt;
    o->values = dst;
    o->nbytes = ne * ampc_dtype_size(dt);
  }
  if (rc == 0 && nout == 0) {
    cli_error("%s: no model tensors (only master.* / optim.* entries, or none at all)", in);
    rc = 1;
  }

  if (rc == 0) {
    /* metadata: what PyTorch tools expect ("format": "pt"), where it came
     * from, and how to make the model's inputs */
    json_t *src_info = json_pack("{s:s, s:s, s:s, s:s}", "exported_by", ampc_version_get()->version, "source_format", fmt ? fmt : "safetensors",
                                 "dtype", ampc_dtype_name(dt), "weights",
                                 from_master ? "parameters from the checkpoint's f32 master weights" : "the file's model tensors");
    if (info) {
      json_t *amp = json_object_get(info, "amp");
      const char *lvl = json_string_value(json_object_get(amp, "opt_level")), *half = json_string_value(json_object_get(amp, "half_type"));
      if (lvl) json_object_set_new(src_info, "opt_level", json_string(lvl));
      if (half) json_object_set_new(src_info, "half_type", json_string(half));
      json_t *ep = json_object_get(info, "epoch"), *st = json_object_get(info, "step");
      if (json_is_integer(ep)) json_object_set(src_info, "epoch", ep);
      if (json_is_integer(st)) json_object_set(src_info, "step", st);
    }
    char *src_js = json_dumps(src_info, JSON_COMPACT | JSON_SORT_KEYS);
    char *pre_js = json_is_object(pre) ? json_dumps(pre, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(src_info);
    const char *meta[16];
    int k = 0;
    meta[k++] = "format";
    meta[k++] = "pt";
    if (model) {
      meta[k++] = "model";
      meta[k++] = model;
    }
    if (src_js) {
      meta[k++] = "ampc";
      meta[k++] = src_js;
    }
    if (pre_js) {
      meta[k++] = "preprocessing";
      meta[k++] = pre_js;
    }
    meta[k] = NULL;
    if (ampc_st_write(out, t, nout, meta) < 0) {
      cli_lib_error("-o");
      rc = 1;
    } else {
      fprintf(stderr, "ampc: wrote %s: %zu tensors (%lld values) of %s as %s, %s; %s\n", cli_shown(out), nout, (long long)values,
              model ? cli_shown(model) : "the model", ampc_dtype_name(dt),
              from_master ? "parameters from the f32 master weights" : "from the model's own tensors",
              pre_js ? "preprocessing recorded in the metadata" : "no preprocessing recorded in the input");
    }
    free(src_js);
    free(pre_js);
  }
  for (size_t i = 0; i < n && bufs; i++) free(bufs[i]);
  free(bufs);
  free(t);
  json_decref(info);
  json_decref(pre);
  ampc_st_close(f);
  return rc;
}
