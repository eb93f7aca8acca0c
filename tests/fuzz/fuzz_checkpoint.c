/* libFuzzer target: a checkpoint against the model it is loaded into (issue
 * 11, classes 1 and 2): ampc_checkpoint_input on the header alone (what the
 * CLI checks before it reads any data) and ampc_checkpoint_load, with every
 * tensor shape, the metadata's input shape and classes, and every number of
 * the run state coming from the input.
 *
 * Input layout:
 *   [0]      which model to load into: 0 mlp 1x1x2 / 2 classes, 1 mlp 1x2x1
 *            / 2 classes (the same tensor shapes: only the recorded input
 *            tells them apart), 2 mlp 1x1x2 / 3 classes
 *   [1..4]   L, the data buffer's length (little-endian u32, at most 1 MiB)
 *   [5..]    the safetensors JSON header
 * The file written is u64 header length, the header, then L bytes of a
 * fixed pattern: the fuzzer works on the header, where the checks are.
 *
 * Checked: a failed load leaves one line of message and the model's values
 * as they were (nothing is restored unless everything checks); a successful
 * one gives a run state within its documented ranges, and a recorded input
 * shape equal to the model's. AMPC_FUZZ_WRITE_SEEDS=DIR writes seed inputs
 * made from real checkpoints of the three models into DIR and exits. */
#include <stddef.h>
#include <stdint.h>

#include "ampc/checkpoint.h"
#include "fuzz_common.h"

#define FUZZ_MAX_DATA (1u << 20)
#define NMODELS 3

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const ampc_model_opts model_opts[NMODELS] = {
    {.batch = 2, .channels = 1, .height = 1, .width = 2, .classes = 2},
    {.batch = 2, .channels = 1, .height = 2, .width = 1, .classes = 2},
    {.batch = 2, .channels = 1, .height = 1, .width = 2, .classes = 3},
};
static ampc_model *models[NMODELS];
static ampc_amp *amps[NMODELS];
static float *before, *after;

static void write_seeds(const char *dir) {
  for (int k = 0; k < NMODELS; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt_%d.safetensors", fuzz_dir(), k);
    ampc_train_state ts = {.seed = 7, .epoch = 2, .batch = 1, .step = 9, .loss_sum = 1.5, .seen = 4, .skipped = 1, .skipped_total = 2, .train_seconds = 0.25,
                           .preprocessing = {"fashion-mnist", 1, 1, 8, 8, {0.25f, 0, 0}, {0.5f, 1, 1}}}; /* its record is fuzzed too */
    FUZZ_CHECK(ampc_checkpoint_save(path, models[k], amps[k], NULL, &ts) == AMPC_OK);
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL);
    uint8_t len8[8];
    FUZZ_CHECK(fread(len8, 1, 8, f) == 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    char *hdr = malloc(hlen);
    FUZZ_CHECK(hdr && fread(hdr, 1, hlen, f) == hlen);
    fseek(f, 0, SEEK_END);
    uint32_t dlen = (uint32_t)((uint64_t)ftell(f) - 8 - hlen);
    fclose(f);
    /* the seed loads into each of the models: its own, and two it must not fit */
    for (int into = 0; into < NMODELS; into++) {
      snprintf(path, sizeof path, "%s/from%d_into%d", dir, k, into);
      FILE *o = fopen(path, "wb");
      FUZZ_CHECK(o != NULL);
      uint8_t head[5] = {(uint8_t)into, (uint8_t)dlen, (uint8_t)(dlen >> 8), (uint8_t)(dlen >> 16), (uint8_t)(dlen >> 24)};
      FUZZ_CHECK(fwrite(head, 1, 5, o) == 5 && fwrite(hdr, 1, hlen, o) == hlen && fclose(o) == 0);
    }
    free(hdr);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  size_t most = 0;
  for (int k = 0; k < NMODELS; k++) {
    ampc_amp_config cfg;
    FUZZ_CHECK(ampc_model_create(&models[k], "mlp", &model_opts[k]) == AMPC_OK);
    FUZZ_CHECK(ampc_amp_config_init(&cfg, AMPC_OPT_O0, AMPC_DTYPE_F16) == AMPC_OK);
    FUZZ_CHECK(ampc_amp_initialize(&amps[k], ampc_model_graph(models[k]), NULL, &cfg) == AMPC_OK);
    size_t n = ampc_graph_param_numel(ampc_model_graph(models[k]));
    if (n > most) most = n;
  }
  before = malloc(most * sizeof *before);
  after = malloc(most * sizeof *after);
  FUZZ_CHECK(before && after);
  const char *seeds = getenv("AMPC_FUZZ_WRITE_SEEDS");
  if (seeds && *seeds) {
    write_seeds(seeds);
    exit(0);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) return 0;
  int k = data[0] % NMODELS;
  uint32_t dlen = (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16 | (uint32_t)data[4] << 24;
  if (dlen > FUZZ_MAX_DATA) return 0;
  size_t hlen = size - 5;
  size_t len = 8 + hlen + dlen;
  uint8_t *file = malloc(len);
  FUZZ_CHECK(file != NULL);
  for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  memcpy(file + 8, data + 5, hlen);
  for (size_t i = 0; i < dlen; i++) file[8 + hlen + i] = (uint8_t)(i % 251 == 0 ? 0x3c : 0); /* small finite floats */
  fuzz_write("ckpt.safetensors", file, len);
  free(file);
  char path[512];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", fuzz_dir());

  const ampc_model_opts *mo = &model_opts[k];
  ampc_graph *g = ampc_model_graph(models[k]);
  size_t np = ampc_graph_param_numel(g);

  /* the CLI's look before reading: the header alone */
  ampc_st_file *hf = NULL;
  int recorded = 0, c = 0, h = 0, w = 0, cls = 0;
  ampc_clear_error();
  if (ampc_st_open_header(&hf, path) == AMPC_OK) {
    ampc_status s = ampc_checkpoint_input(hf, &c, &h, &w, &cls);
    FUZZ_CHECK(s == 0 || s == 1 || s == AMPC_EFORMAT);
    if (s == 1) {
      recorded = 1;
      FUZZ_CHECK(c >= 1 && h >= 1 && w >= 1 && cls >= 2);
    }
    for (size_t i = 0; i < ampc_st_count(hf); i++) FUZZ_CHECK(ampc_st_get(hf, i)->values == NULL);
    ampc_st_close(hf);
  }

  ampc_amp_param_values(amps[k], before);
  ampc_train_state ts;
  memset(&ts, 0xa5, sizeof ts);
  ampc_clear_error();
  ampc_status s = ampc_checkpoint_load(path, models[k], amps[k], NULL, &ts);
  if (s < 0) {
    const char *msg = ampc_last_error();
    FUZZ_CHECK(msg[0] != '\0' && strchr(msg, '\n') == NULL);
    FUZZ_CHECK(strncmp(msg, "checkpoint: ", 12) == 0 || strncmp(msg, "safetensors: ", 13) == 0);
    ampc_amp_param_values(amps[k], after);
    FUZZ_CHECK(memcmp(before, after, np * sizeof *before) == 0);
    return 0;
  }
  /* loaded: the file was made for this model, and its run state is in range */
  if (recorded) FUZZ_CHECK(c == mo->channels && h == mo->height && w == mo->width && cls == mo->classes);
  FUZZ_CHECK(ts.seed <= (uint64_t)INT64_MAX && ts.epoch >= 0 && ts.batch >= 0 && ts.step >= 0 && ts.seen >= 0);
  FUZZ_CHECK(ts.skipped >= 0 && ts.skipped <= ts.skipped_total && ts.skipped_total <= ts.step);
  FUZZ_CHECK(ts.loss_sum >= 0 && ts.train_seconds >= 0);
  return 0;
}
