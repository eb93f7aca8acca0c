/* Prints the order in which `ampc train` visits the training images: for each
 * epoch, the dataset index of every sample, one per line. With an ampc
 * checkpoint of the initial weights, bench/pytorch_same_start.py replays the
 * same run in PyTorch (same start, same batches), which separates what the
 * seed decides from what the framework does.
 *
 * usage: loader-order [--dataset NAME] [--data DIR] [--seed N] [--epochs N] [--train-limit N] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampc/ampc.h"

static int parse_u64(const char *flag, const char *s, unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-') {
    fprintf(stderr, "loader-order: %s: expected a non-negative integer, got '%s'\n", flag, s);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  const char *dataset = "fashion-mnist", *dir = NULL;
  unsigned long long seed = 0, epochs = 3, limit = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      printf("usage: loader-order [--dataset NAME] [--data DIR] [--seed N] [--epochs N] [--train-limit N]\n");
      return 0;
    }
    if (!v) {
      fprintf(stderr, "loader-order: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (strcmp(a, "--dataset") == 0) dataset = v;
    else if (strcmp(a, "--data") == 0) dir = v;
    else if (strcmp(a, "--seed") == 0) { if (parse_u64(a, v, &seed) < 0) return 2; }
    else if (strcmp(a, "--epochs") == 0) { if (parse_u64(a, v, &epochs) < 0) return 2; }
    else if (strcmp(a, "--train-limit") == 0) { if (parse_u64(a, v, &limit) < 0) return 2; }
    else {
      fprintf(stderr, "loader-order: unknown option '%s'\n", a);
      return 2;
    }
  }
  ampc_dataset_kind kind;
  ampc_dataset *d = NULL;
  ampc_loader *l = NULL;
  if (ampc_dataset_kind_parse(dataset, &kind) < 0 ||
      ampc_dataset_open(&d, kind, dir ? dir : ampc_dataset_default_dir(kind), 1, (size_t)limit) < 0) {
    fprintf(stderr, "loader-order: %s\n", ampc_last_error());
    return 1;
  }
  ampc_loader_opts o;
  ampc_loader_opts_default(&o); /* the order depends on the seed and the dataset's size alone */
  o.seed = seed;
  size_t n = ampc_dataset_count(d);
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  if (!order || ampc_loader_create(&l, d, &o) < 0) {
    fprintf(stderr, "loader-order: %s\n", order ? ampc_last_error() : "out of memory");
    free(order);
    ampc_dataset_free(d);
    return 1;
  }
  for (unsigned long long e = 0; e < epochs; e++) {
    if (ampc_loader_epoch_order(l, (int64_t)e, order) < 0) break;
    for (size_t i = 0; i < n; i++) printf("%zu\n", order[i]);
  }
  ampc_loader_free(l);
  ampc_dataset_free(d);
  free(order);
  return ferror(stdout) ? 1 : 0;
}
