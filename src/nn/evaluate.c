/* The evaluation loop: a model's mean loss and accuracy over a dataset. */
#include <math.h>
#include <stdlib.h>

#include "ampc/nn.h"
#include "core/status_internal.h"

ampc_status ampc_model_evaluate(ampc_model *m, const ampc_dataset *d, int normalize, ampc_eval_result *out) {
  if (!m || !d || !out)
    return ampc__error(AMPC_EINVAL, "ampc_model_evaluate: %s is NULL", !m ? "model" : !d ? "dataset" : "out");
  ampc_graph *g = ampc_model_graph(m);
  if (!ampc_graph_is_compiled(g)) return ampc__error(AMPC_ESTATE, "evaluate: the model's graph is not compiled");
  ampc_value xv = ampc_model_input(m), yv = ampc_model_labels(m), lv = ampc_model_logits(m);
  int64_t B = ampc_graph_max_batch(g);
  ampc_tensor xt = ampc_graph_tensor(g, xv), lt = ampc_graph_tensor(g, lv);
  size_t per_image = (size_t)(ampc_tensor_numel(&xt) / ampc_graph_batch(g)), K = (size_t)lt.shape.d[1];
  if ((size_t)ampc_dataset_channels(d) * (size_t)ampc_dataset_height(d) * (size_t)ampc_dataset_width(d) != per_image)
    return ampc__error(AMPC_EINVAL, "evaluate: the dataset's images (%d x %d x %d) are not the model's input (%zu values)",
                       ampc_dataset_channels(d), ampc_dataset_height(d), ampc_dataset_width(d), per_image);
  ampc_loader_opts lo;
  ampc_loader_opts_default(&lo);
  lo.batch_size = (int)B;
  lo.shuffle = 0;
  lo.normalize = normalize;
  lo.dtype = xt.dtype; /* the model's own input type: the write converts nothing */
  /* host staging the loader fills, and the logits read back */
  void *x = malloc((size_t)B * per_image * ampc_dtype_size(xt.dtype));
  int32_t *y = malloc((size_t)B * sizeof *y);
  float *logits = malloc((size_t)B * K * sizeof *logits);
  ampc_loader *l = NULL;
  ampc_status s = x && y && logits ? AMPC_OK : ampc__error(AMPC_ENOMEM, "evaluate: out of memory");
  if (s == 0) s = ampc_loader_create(&l, d, &lo);
  if (s == 0) s = ampc_loader_start_epoch(l, 0, 0);
  double total = 0.0;
  int64_t correct = 0, seen = 0;
  while (s == 0) {
    int n = 0;
    s = ampc_loader_next(l, x, y, &n);
    if (s < 0 || n == 0) break;
    s = ampc_graph_set_batch(g, n);
    if (s == 0) s = ampc_graph_write(g, xv, x, xt.dtype);
    if (s == 0) s = ampc_graph_write(g, yv, y, AMPC_DTYPE_I32);
    if (s == 0) s = ampc_graph_forward(g, 0);
    float loss = 0.0f;
    if (s == 0) s = ampc_graph_read(g, ampc_model_loss(m), &loss, AMPC_DTYPE_F32);
    if (s == 0) s = ampc_graph_read(g, lv, logits, AMPC_DTYPE_F32);
    if (s < 0) break;
    total += (double)loss * n;
    for (int i = 0; i < n; i++) {
      const float *row = logits + (size_t)i * K;
      size_t best = 0;
      for (size_t j = 1; j < K; j++)
        if (row[j] > row[best]) best = j;
      correct += (int32_t)best == y[i];
    }
    seen += n;
  }
  ampc_loader_free(l);
  free(x);
  free(y);
  free(logits);
  ampc_graph_set_batch(g, B);
  if (s < 0) return s;
  out->loss = seen ? total / (double)seen : NAN;
  out->accuracy = seen ? (double)correct / (double)seen : NAN;
  out->images = (size_t)seen;
  return AMPC_OK;
}
