/* The preprocessing record of a dataset: what the loader does to its pixels. */
#include <stdio.h>
#include <string.h>

#include "ampc/data.h"

void ampc_dataset_preprocessing(const ampc_dataset *d, int normalize, ampc_preprocessing *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  snprintf(out->dataset, sizeof out->dataset, "%s", ampc_dataset_kind_name(ampc_dataset_get_kind(d)));
  out->normalize = normalize != 0;
  out->channels = ampc_dataset_channels(d);
  out->height = ampc_dataset_height(d);
  out->width = ampc_dataset_width(d);
  ampc_dataset_norm(d, out->mean, out->std);
  /* without normalisation the same formula holds with mean 0 and std 1 */
  for (int c = 0; !out->normalize && c < 3; c++) {
    out->mean[c] = 0.0f;
    out->std[c] = 1.0f;
  }
}
