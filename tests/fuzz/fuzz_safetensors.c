/* libFuzzer target: the safetensors reader. The input is the whole file; it
 * is opened from memory (ampc_st_open_memory) and from a file
 * (ampc_st_open), and the two must agree. A successful open is then checked
 * against what safetensors.h promises -- names findable, data 64-byte
 * aligned, nbytes = numel * element size, the tensors covering the data
 * buffer exactly -- and every tensor is converted with ampc_st_read_f32 or
 * ampc_st_read_i32. */
#include <stddef.h>
#include <stdint.h>

#include "ampc/safetensors.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* A failed open: *out NULL, and one line naming the buffer or file. */
static void check_failure(const ampc_st_file *f, const char *label) {
  const char *msg = ampc_last_error();
  FUZZ_CHECK(f == NULL);
  FUZZ_CHECK(strncmp(msg, "safetensors: ", 13) == 0);
  FUZZ_CHECK(strstr(msg, label) != NULL);
  FUZZ_CHECK(strchr(msg, '\n') == NULL);
}

static void check_file(const ampc_st_file *f, const char *label, size_t size, const uint8_t *data) {
  FUZZ_CHECK(strcmp(ampc_st_label(f), label) == 0);
  size_t n = ampc_st_count(f);
  uint64_t total = 0, data_len = size - 8 - le64(data);
  FUZZ_CHECK(ampc_st_get(f, n) == NULL);
  for (size_t i = 0; i < n; i++) {
    const ampc_st_tensor *t = ampc_st_get(f, i);
    FUZZ_CHECK(t && t->name);
    FUZZ_CHECK(strcmp(t->name, "__metadata__") != 0);
    FUZZ_CHECK(ampc_st_find(f, t->name) == t);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= AMPC_ST_MAX_DIMS);
    int64_t numel = ampc_st_numel(t);
    FUZZ_CHECK(numel >= 0);
    FUZZ_CHECK((uint64_t)t->nbytes == (uint64_t)numel * ampc_dtype_size(t->dtype));
    FUZZ_CHECK(t->nbytes == 0 || (t->values && (uintptr_t)t->values % 64 == 0));
    total += t->nbytes;
    /* numel <= data_len here, so the buffer is at most the input's size. */
    size_t cnt = (size_t)numel;
    if (ampc_dtype_is_float(t->dtype)) {
      float *dst = malloc((cnt ? cnt : 1) * sizeof *dst);
      FUZZ_CHECK(dst != NULL);
      ampc_status s = ampc_st_read_f32(t, dst, cnt);
      FUZZ_CHECK(s == AMPC_OK || s == AMPC_ERANGE);
      if (cnt) FUZZ_CHECK(ampc_st_read_f32(t, dst, cnt - 1) == AMPC_EINVAL);
      free(dst);
    } else {
      int32_t *dst = malloc((cnt ? cnt : 1) * sizeof *dst);
      FUZZ_CHECK(dst != NULL);
      ampc_status s = ampc_st_read_i32(t, dst, cnt);
      FUZZ_CHECK(s == AMPC_OK || s == AMPC_ERANGE);
      FUZZ_CHECK(ampc_st_read_f32(t, (float *)dst, cnt) == AMPC_EINVAL);
      free(dst);
    }
  }
  /* No gaps and no overlaps: the tensors add up to the data buffer. */
  FUZZ_CHECK(total == data_len);
  size_t nm = ampc_st_metadata_count(f);
  FUZZ_CHECK(ampc_st_metadata_key(f, nm) == NULL);
  for (size_t i = 0; i < nm; i++) {
    const char *k = ampc_st_metadata_key(f, i);
    FUZZ_CHECK(k && ampc_st_metadata(f, k) != NULL);
    if (i) FUZZ_CHECK(strcmp(ampc_st_metadata_key(f, i - 1), k) < 0);
  }
  FUZZ_CHECK(ampc_st_find(f, "__metadata__") == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char label[] = "fuzz-input";
  ampc_st_file *mf = (ampc_st_file *)1, *ff = (ampc_st_file *)1;
  ampc_clear_error();
  ampc_status ms = ampc_st_open_memory(&mf, data, size, label);
  if (ms < 0) check_failure(mf, label);
  else check_file(mf, label, size, data);

  fuzz_write("t.safetensors", data, size);
  char path[512];
  snprintf(path, sizeof path, "%s/t.safetensors", fuzz_dir());
  ampc_clear_error();
  ampc_status fs = ampc_st_open(&ff, path);
  if (fs < 0) check_failure(ff, path);
  else check_file(ff, path, size, data);

  /* The same bytes give the same answer from memory and from a file. */
  FUZZ_CHECK(ms == fs);
  if (ms == AMPC_OK) {
    FUZZ_CHECK(ampc_st_count(mf) == ampc_st_count(ff));
    for (size_t i = 0; i < ampc_st_count(mf); i++) {
      const ampc_st_tensor *a = ampc_st_get(mf, i), *b = ampc_st_get(ff, i);
      FUZZ_CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->nbytes == b->nbytes);
      FUZZ_CHECK(a->nbytes == 0 || memcmp(a->values, b->values, a->nbytes) == 0);
    }
  }
  ampc_st_close(mf);
  ampc_st_close(ff);
  return 0;
}
