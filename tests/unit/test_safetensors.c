/* safetensors: round trips, exact bytes both ways, the fixture made by
 * Python, a table of malformed inputs, element conversion, and atomic writes
 * under injected write failures. */
#include <dirent.h>
#include <float.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ampc/safetensors.h"
#include "core/status_internal.h"
#include "io/fsutil_internal.h"
#include "test.h"

#define TMP(name) AMPC_TEST_TMPDIR "/" name

/* Whole file into a malloc'd buffer; NULL if unreadable. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
  if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(fp);
  *len = (size_t)n;
  return b;
}

static int spit(const char *path, const void *b, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return -1;
  size_t w = fwrite(b, 1, n, fp);
  return fclose(fp) == 0 && w == n ? 0 : -1;
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Temporary files this process's atomic writes to target base left behind
 * (the writer names them ".<base>.tmp.<pid>.<n>"; other runs' are ignored). */
static int count_temps(const char *dir, const char *base) {
  char prefix[256];
  snprintf(prefix, sizeof prefix, ".%s.tmp.%ld.", base, (long)getpid());
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
  closedir(d);
  return n;
}

/* 8-byte little-endian length + header + data_len zero bytes. */
static unsigned char *mkfile(const char *json, size_t data_len, size_t *len) {
  size_t h = strlen(json);
  *len = 8 + h + data_len;
  unsigned char *b = calloc(1, *len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(b + 8, json, h);
  return b;
}

static uint64_t le64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

TEST(roundtrip_all_dtypes) {
  /* One tensor per dtype; odd sizes so that tensors sit at unaligned offsets
   * in the file, a scalar, an empty tensor, and an 8-dim one. */
  float f32[6] = {1.5f, -2.0f, 0.0f, -0.0f, 1e-40f, 3.4e38f};
  uint16_t f16[5] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
  uint16_t bf16[3] = {0x3f80, 0xc049, 0xff80};
  double f64[2] = {0.1, -1e300};
  int64_t i64[3] = {INT64_MIN, -1, INT64_MAX};
  int32_t i32[1] = {-123456};
  int16_t i16[3] = {-32768, 0, 32767};
  int8_t i8[7] = {-128, -1, 0, 1, 2, 3, 127};
  uint8_t boolv[4] = {1, 0, 0, 1};
  const ampc_st_tensor in[] = {
      {"a.f32", AMPC_DTYPE_F32, 2, {2, 3}, f32, sizeof f32},
      {"b.f16", AMPC_DTYPE_F16, 1, {5}, f16, sizeof f16},
      {"c.bf16", AMPC_DTYPE_BF16, 1, {3}, bf16, sizeof bf16},
      {"d.f64", AMPC_DTYPE_F64, 2, {2, 1}, f64, sizeof f64},
      {"e.i64", AMPC_DTYPE_I64, 1, {3}, i64, sizeof i64},
      {"f.i32", AMPC_DTYPE_I32, 0, {0}, i32, sizeof i32},
      {"g.i16", AMPC_DTYPE_I16, 3, {1, 1, 3}, i16, sizeof i16},
      {"h.i8", AMPC_DTYPE_I8, 1, {7}, i8, sizeof i8},
      {"i.u8.empty", AMPC_DTYPE_U8, 2, {0, 5}, NULL, 0},
      {"j.bool", AMPC_DTYPE_BOOL, 8, {2, 2, 1, 1, 1, 1, 1, 1}, boolv, sizeof boolv},
  };
  const size_t n = sizeof in / sizeof in[0];
  const char *meta[] = {"format", "pt", "note", "\xc3\xbcnicode \xe2\x9c\x93", NULL};
  const char *path = TMP("roundtrip.safetensors");
  CHECK_OK(ampc_st_write(path, in, n, meta));

  ampc_st_file *f = NULL;
  CHECK_OK(ampc_st_open(&f, path));
  if (!f) return;
  CHECK(strcmp(ampc_st_label(f), path) == 0);
  CHECK(ampc_st_count(f) == n);
  for (size_t i = 0; i < n && i < ampc_st_count(f); i++) {
    const ampc_st_tensor *t = ampc_st_get(f, i); /* data order == the order written */
    CHECK_MSG(strcmp(t->name, in[i].name) == 0, "tensor %zu: %s", i, t->name);
    CHECK(t->dtype == in[i].dtype);
    CHECK(t->ndim == in[i].ndim);
    for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == in[i].shape[d]);
    CHECK(t->nbytes == in[i].nbytes);
    CHECK(t->values != NULL);
    CHECK((uintptr_t)t->values % 64 == 0);
    CHECK(t->nbytes == 0 || memcmp(t->values, in[i].values, t->nbytes) == 0);
    CHECK(ampc_st_find(f, in[i].name) == t);
  }
  CHECK(ampc_st_get(f, n) == NULL);
  CHECK(ampc_st_find(f, "nope") == NULL);
  CHECK(ampc_st_find(f, "__metadata__") == NULL);
  CHECK(ampc_st_metadata_count(f) == 2);
  CHECK(ampc_st_metadata(f, "format") && strcmp(ampc_st_metadata(f, "format"), "pt") == 0);
  CHECK(ampc_st_metadata(f, "note") && strcmp(ampc_st_metadata(f, "note"), meta[3]) == 0);
  CHECK(ampc_st_metadata(f, "absent") == NULL);
  CHECK(ampc_st_metadata_key(f, 0) && strcmp(ampc_st_metadata_key(f, 0), "format") == 0);
  CHECK(ampc_st_metadata_key(f, 1) && strcmp(ampc_st_metadata_key(f, 1), "note") == 0);
  CHECK(ampc_st_metadata_key(f, 2) == NULL);
  ampc_st_close(f);

  /* The data buffer starts at a multiple of 8, after space padding, and the
   * same bytes parse from memory too. */
  size_t len;
  unsigned char *raw = slurp(path, &len);
  CHECK(raw != NULL);
  if (!raw) return;
  uint64_t h = le64(raw);
  CHECK((8 + h) % 8 == 0);
  CHECK(raw[8] == '{');
  size_t j = 8 + (size_t)h;
  while (j > 8 && raw[j - 1] == ' ') j--;
  CHECK(raw[j - 1] == '}');
  CHECK(ampc_st_open_memory(&f, raw, len, "copy") == 0 && ampc_st_count(f) == n);
  ampc_st_close(f);
  free(raw);
}

TEST(write_exact_bytes) {
  /* The writer's output, byte for byte: compact JSON, "__metadata__" first,
   * entry keys in the order dtype, shape, data_offsets, one space of padding
   * (8 + 79 + 1 = 88), then the data. */
  uint16_t x[2] = {0x3c00, 0xc000};
  const ampc_st_tensor t = {"x", AMPC_DTYPE_F16, 1, {2}, x, sizeof x};
  const char *meta[] = {"k", "v", NULL};
  const char *path = TMP("exact.safetensors");
  CHECK_OK(ampc_st_write(path, &t, 1, meta));
  static const char json[] =
      "{\"__metadata__\":{\"k\":\"v\"},\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}} ";
  unsigned char want[8 + sizeof json - 1 + 4] = {80, 0, 0, 0, 0, 0, 0, 0};
  memcpy(want + 8, json, sizeof json - 1);
  memcpy(want + 8 + sizeof json - 1, "\x00\x3c\x00\xc0", 4);
  size_t len;
  unsigned char *got = slurp(path, &len);
  CHECK(got && len == sizeof want);
  CHECK(got && len == sizeof want && memcmp(got, want, len) == 0);
  free(got);

  /* No tensors and no metadata: "{}" padded to 8 bytes. */
  CHECK_OK(ampc_st_write(path, NULL, 0, NULL));
  got = slurp(path, &len);
  CHECK(got && len == 16 && memcmp(got, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
  free(got);
  ampc_st_file *f = NULL;
  CHECK_OK(ampc_st_open(&f, path));
  CHECK(f && ampc_st_count(f) == 0 && ampc_st_metadata_count(f) == 0 && ampc_st_get(f, 0) == NULL);
  ampc_st_close(f);
}

TEST(known_bytes) {
  /* Built by hand from the format description: N = 141 (0x8d) including 3
   * trailing spaces; "__metadata__" last; a U8 tensor first so the F32 one
   * sits at the odd offset 3 of the data buffer. */
  static const char bytes[] =
      "\x8d\x00\x00\x00\x00\x00\x00\x00"
      "{\"p\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[3,11]},"
      "\"__metadata__\":{\"format\":\"pt\"}}   "
      "\x01\x02\x03"
      "\x00\x00\x80\x3f\x00\x00\x00\xc0";
  const size_t len = sizeof bytes - 1;
  CHECK(len == 8 + 141 + 11);
  const char *path = TMP("known.safetensors");
  CHECK(spit(path, bytes, len) == 0);
  for (int from_file = 0; from_file < 2; from_file++) {
    ampc_st_file *f = NULL;
    if (from_file)
      CHECK_OK(ampc_st_open(&f, path));
    else
      CHECK_OK(ampc_st_open_memory(&f, bytes, len, "known"));
    if (!f) continue;
    CHECK(ampc_st_count(f) == 2);
    const ampc_st_tensor *p = ampc_st_get(f, 0), *w = ampc_st_get(f, 1);
    CHECK(p && strcmp(p->name, "p") == 0 && p->dtype == AMPC_DTYPE_U8 && p->ndim == 1 && p->shape[0] == 3);
    CHECK(w && strcmp(w->name, "w") == 0 && w->dtype == AMPC_DTYPE_F32 && w->nbytes == 8);
    if (p && w) {
      const uint8_t *pb = p->values;
      CHECK(pb[0] == 1 && pb[1] == 2 && pb[2] == 3);
      const float *wf = w->values; /* realigned in memory, so usable directly */
      CHECK(wf[0] == 1.0f && wf[1] == -2.0f);
      int32_t pi[3];
      CHECK_OK(ampc_st_read_i32(p, pi, 3));
      CHECK(pi[0] == 1 && pi[2] == 3);
    }
    CHECK(ampc_st_metadata(f, "format") && strcmp(ampc_st_metadata(f, "format"), "pt") == 0);
    ampc_st_close(f);
  }
}

TEST(python_fixture) {
  /* tests/fixtures/tiny.safetensors, written by make_safetensors_fixture.py
   * in the official writer's layout. */
  ampc_st_file *f = NULL;
  CHECK_OK(ampc_st_open(&f, AMPC_TEST_FIXTURES "/tiny.safetensors"));
  if (!f) return;
  CHECK(ampc_st_count(f) == 9);
  CHECK(strcmp(ampc_st_get(f, 0)->name, "double") == 0); /* first by alignment, then name */
  CHECK(strcmp(ampc_st_metadata(f, "format"), "pt") == 0);
  CHECK(strcmp(ampc_st_metadata(f, "producer"), "make_safetensors_fixture.py") == 0);

  float v[6];
  const ampc_st_tensor *t = ampc_st_find(f, "conv.weight");
  CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
  CHECK_OK(ampc_st_read_f32(t, v, 6));
  CHECK(v[0] == 1.5f && v[1] == -2.25f && v[2] == 0.375f && v[3] == 1e30f && v[5] == 7.0f);
  CHECK(v[4] == 0.0f && signbit(v[4]));
  t = ampc_st_find(f, "half");
  CHECK_OK(ampc_st_read_f32(t, v, 4));
  CHECK(v[0] == 1.0f && v[1] == 65504.0f && v[2] == 0x1p-24f && isinf(v[3]) && v[3] < 0);
  t = ampc_st_find(f, "brain");
  CHECK_OK(ampc_st_read_f32(t, v, 3));
  CHECK(v[0] == 1.0f && v[1] == -3.140625f && v[2] == 0x1p-133f);
  t = ampc_st_find(f, "double");
  CHECK_OK(ampc_st_read_f32(t, v, 2));
  CHECK(v[0] == 0.1f && v[1] == 2.5f);

  int32_t l[5];
  CHECK_OK(ampc_st_read_i32(ampc_st_find(f, "labels"), l, 5));
  CHECK(l[0] == 0 && l[1] == 9 && l[2] == 3 && l[3] == -1 && l[4] == INT32_MAX);
  t = ampc_st_find(f, "step");
  CHECK(t && t->ndim == 0);
  CHECK_OK(ampc_st_read_i32(t, l, 1));
  CHECK(l[0] == 1234);
  CHECK_OK(ampc_st_read_i32(ampc_st_find(f, "pixels"), l, 3));
  CHECK(l[0] == 0 && l[1] == 128 && l[2] == 255);
  CHECK_OK(ampc_st_read_i32(ampc_st_find(f, "mask"), l, 2));
  CHECK(l[0] == 1 && l[1] == 0);
  t = ampc_st_find(f, "empty");
  CHECK(t && t->nbytes == 0 && t->shape[0] == 0 && t->shape[1] == 4);
  CHECK_OK(ampc_st_read_f32(t, NULL, 0));
  ampc_st_close(f);
}

typedef struct {
  const char *json;
  size_t data_len;
  int code;
  const char *msg;
} bad_case;

#define T1(body) "{\"a\":{" body "}}"
#define F32_4 "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"

static const bad_case bad_cases[] = {
    {"", 0, AMPC_EFORMAT, "malformed JSON header"},
    {"{\"a\":", 0, AMPC_EFORMAT, "malformed JSON header"},
    {"{\"a\":{}} x", 0, AMPC_EFORMAT, "malformed JSON header"},
    {"{\"\xff\":{}}", 0, AMPC_EFORMAT, "malformed JSON header"},
    {"{\"a\\u0000b\":{" F32_4 "}}", 4, AMPC_EFORMAT, "malformed JSON header"},
    {"[1,2]", 0, AMPC_EFORMAT, "header is an array, not a JSON object"},
    {"\"x\"", 0, AMPC_EFORMAT, "header is a string, not a JSON object"},
    {"{\"a\":1}", 0, AMPC_EFORMAT, "tensor 'a': entry is an integer, not an object"},
    {"{\"a\":[]}", 0, AMPC_EFORMAT, "tensor 'a': entry is an array, not an object"},
    {T1("\"shape\":[1],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "tensor 'a': missing \"dtype\""},
    {T1("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "tensor 'a': missing \"shape\""},
    {T1("\"dtype\":\"F32\",\"shape\":[1]"), 4, AMPC_EFORMAT, "tensor 'a': missing \"data_offsets\""},
    {T1("\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "\"dtype\" is an integer, not a string"},
    {T1("\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "unknown dtype 'F17'"},
    {T1("\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "unknown dtype 'f32'"},
    {T1("\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]"), 4, AMPC_EUNSUPPORTED, "dtype 'U16' is not supported"},
    {T1("\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "\"shape\" is an integer, not an array"},
    {T1("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "shape[0] = -1 is negative"},
    {T1("\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]"), 8, AMPC_EFORMAT, "shape[1] is a real number, not an integer"},
    {T1("\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "shape[0] is a string, not an integer"},
    {T1("\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]"), 4, AMPC_EUNSUPPORTED, "9 dims, at most 8"},
    {T1("\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]"), 0, AMPC_EFORMAT, "shape product overflows"},
    {T1("\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]"), 0, AMPC_EFORMAT, "shape product overflows"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":0"), 4, AMPC_EFORMAT, "\"data_offsets\" is not an array of 2 integers"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]"), 8, AMPC_EFORMAT, "not an array of 2 integers"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]"), 4, AMPC_EFORMAT, "not an array of 2 integers"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]"), 4, AMPC_EFORMAT, "not an array of 2 integers"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"), 4, AMPC_EFORMAT, "data_offsets [-4, 0] are negative"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"), 8, AMPC_EFORMAT, "data_offsets [8, 4]: begin > end"},
    {T1("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]"), 4, AMPC_EFORMAT, "end 8 is past the end of the 4-byte data buffer"},
    {T1("\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"), 4, AMPC_EFORMAT, "hold 4 bytes but F32 [2] needs 8"},
    {T1("\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,6]"), 6, AMPC_EFORMAT, "hold 6 bytes but BF16 [2, 3] needs 12"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, AMPC_EFORMAT,
     "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, AMPC_EFORMAT, "overlap"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, AMPC_EFORMAT,
     "bytes [4, 8) of the data buffer belong to no tensor"},
    {T1("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]"), 8, AMPC_EFORMAT, "bytes [0, 4) of the data buffer belong to no tensor"},
    {T1(F32_4), 8, AMPC_EFORMAT, "bytes [4, 8) at the end of the data buffer belong to no tensor"},
    {"{}", 4, AMPC_EFORMAT, "bytes [0, 4) at the end of the data buffer"},
    {"{\"a\":{" F32_4 "},\"a\":{" F32_4 "}}", 4, AMPC_EFORMAT, "duplicate object key"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, AMPC_EFORMAT, "duplicate object key"},
    {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, AMPC_EFORMAT, "duplicate object key"},
    {"{\"__metadata__\":[1]}", 0, AMPC_EFORMAT, "__metadata__ is an array, not a string->string object"},
    {"{\"__metadata__\":\"pt\"}", 0, AMPC_EFORMAT, "__metadata__ is a string, not a string->string object"},
    {"{\"__metadata__\":{\"k\":1}}", 0, AMPC_EFORMAT, "__metadata__ 'k' is an integer, not a string"},
    {"{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, AMPC_EFORMAT, "__metadata__ 'k' is an object, not a string"},
};

TEST(bad_inputs) {
  char label[64];
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_case *c = &bad_cases[i];
    size_t len;
    unsigned char *b = mkfile(c->json, c->data_len, &len);
    snprintf(label, sizeof label, "bad_%zu.safetensors", i);
    ampc_st_file *f = (ampc_st_file *)&label; /* must be reset to NULL on failure */
    CHECK_ERR(ampc_st_open_memory(&f, b, len, label), c->code, c->msg);
    CHECK_MSG(strstr(ampc_last_error(), label) && strncmp(ampc_last_error(), "safetensors: ", 13) == 0,
              "case %zu: message does not name the input: %s", i, ampc_last_error());
    CHECK_MSG(strchr(ampc_last_error(), '\n') == NULL, "case %zu: message is not one line", i);
    CHECK(f == NULL);
    if (f && f != (ampc_st_file *)&label) ampc_st_close(f);
    free(b);
  }
}

TEST(bad_lengths) {
  /* Shorter than the length field. */
  ampc_st_file *f;
  CHECK_ERR(ampc_st_open_memory(&f, "\x02\0\0\0\0", 5, "short"), AMPC_EFORMAT,
            "safetensors: short: file is 5 bytes, shorter than the 8-byte header length");
  CHECK_ERR(ampc_st_open_memory(&f, NULL, 0, NULL), AMPC_EFORMAT, "<memory>: file is 0 bytes");
  /* Absurd header length (1 TB) and one past the end of the file. */
  unsigned char b[24] = {0, 0, 0, 0, 0x01, 0, 0, 0, '{', '}'};
  CHECK_ERR(ampc_st_open_memory(&f, b, sizeof b, "huge"), AMPC_EFORMAT,
            "header length 4294967296 is absurd (limit 100000000 bytes)");
  b[4] = 0;
  b[0] = 17;
  CHECK_ERR(ampc_st_open_memory(&f, b, sizeof b, "past"), AMPC_EFORMAT,
            "header length 17 runs past the end of the file (16 bytes follow it)");
  /* Trailing spaces in the header are the format's padding: accepted. */
  b[0] = 16;
  memset(b + 10, ' ', 14);
  CHECK_OK(ampc_st_open_memory(&f, b, sizeof b, "padded"));
  CHECK(f && ampc_st_count(f) == 0);
  ampc_st_close(f);
  /* Unknown keys in an entry are ignored, as the official reader does; a
   * null __metadata__ means none. */
  size_t len;
  unsigned char *m = mkfile("{\"__metadata__\":null,\"a\":{" F32_4 ",\"extra\":[1]}}", 4, &len);
  CHECK_OK(ampc_st_open_memory(&f, m, len, "extra"));
  CHECK(f && ampc_st_count(f) == 1 && ampc_st_metadata_count(f) == 0);
  ampc_st_close(f);
  free(m);
  CHECK_ERR(ampc_st_open_memory(NULL, b, sizeof b, "x"), AMPC_EINVAL, "out is NULL");
}

TEST(bad_files) {
  /* From disk, the message names the path. */
  const char *path = TMP("bad_short.safetensors");
  CHECK(spit(path, "\x01\0\0", 3) == 0);
  ampc_st_file *f;
  CHECK_ERR(ampc_st_open(&f, path), AMPC_EFORMAT, "file is 3 bytes, shorter than the 8-byte header length");
  CHECK(strstr(ampc_last_error(), path) != NULL);
  size_t len;
  unsigned char *b = mkfile(T1("\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"), 16, &len);
  path = TMP("bad_truncated.safetensors");
  CHECK(spit(path, b, len - 5) == 0); /* a download cut short */
  CHECK_ERR(ampc_st_open(&f, path), AMPC_EFORMAT, "end 16 is past the end of the 11-byte data buffer");
  CHECK(strstr(ampc_last_error(), path) != NULL);
  CHECK(spit(path, b, 8 + 3) == 0);
  CHECK_ERR(ampc_st_open(&f, path), AMPC_EFORMAT, "runs past the end of the file");
  free(b);
  CHECK_ERR(ampc_st_open(&f, TMP("does_not_exist.safetensors")), AMPC_ENOTFOUND, "cannot open: No such file");
  CHECK(f == NULL);
  CHECK_ERR(ampc_st_open(&f, AMPC_TEST_TMPDIR), AMPC_EIO, "not a regular file");
  CHECK_ERR(ampc_st_open(&f, NULL), AMPC_EINVAL, "path is NULL");
  ampc_st_close(NULL);
}

TEST(read_conversions) {
  /* Caller-made descriptions with data at odd addresses: the readers must
   * not assume alignment. */
  unsigned char buf[64];
  unsigned char *p = buf + 1;
  float v[4];
  int32_t l[4];

  uint16_t h[4] = {0x3c00, 0xc000, 0x7bff, 0x7c00};
  memcpy(p, h, sizeof h);
  ampc_st_tensor t = {"h", AMPC_DTYPE_F16, 1, {4}, p, 8};
  CHECK_OK(ampc_st_read_f32(&t, v, 4));
  CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 65504.0f && isinf(v[3]));
  CHECK_ERR(ampc_st_read_f32(&t, v, 3), AMPC_EINVAL, "tensor 'h': F16 [4] has 4 elements, caller expects 3");

  uint16_t bf[2] = {0x3f80, 0xc049};
  memcpy(p, bf, sizeof bf);
  t = (ampc_st_tensor){"b", AMPC_DTYPE_BF16, 2, {1, 2}, p, 4};
  CHECK_OK(ampc_st_read_f32(&t, v, 2));
  CHECK(v[0] == 1.0f && v[1] == -3.140625f);

  float ff[2] = {0.25f, -1e-45f};
  memcpy(p, ff, sizeof ff);
  t = (ampc_st_tensor){"f", AMPC_DTYPE_F32, 1, {2}, p, 8};
  CHECK_OK(ampc_st_read_f32(&t, v, 2));
  CHECK(v[0] == 0.25f && v[1] == -1e-45f);

  /* f64: values that round to FLT_MAX are fine, ones that round to infinity
   * are refused; NaN and infinities pass through. */
  double d[4] = {(double)FLT_MAX + 0x1p102, -INFINITY, NAN, 0.1};
  memcpy(p, d, sizeof d);
  t = (ampc_st_tensor){"d", AMPC_DTYPE_F64, 1, {4}, p, 32};
  CHECK_OK(ampc_st_read_f32(&t, v, 4));
  CHECK(v[0] == FLT_MAX && isinf(v[1]) && v[1] < 0 && isnan(v[2]) && v[3] == 0.1f);
  d[1] = -((double)FLT_MAX + 0x1p103);
  memcpy(p, d, sizeof d);
  CHECK_ERR(ampc_st_read_f32(&t, v, 4), AMPC_ERANGE, "tensor 'd': element 1 = ");
  d[1] = 1e300;
  memcpy(p, d, sizeof d);
  CHECK_ERR(ampc_st_read_f32(&t, v, 4), AMPC_ERANGE, "does not fit in f32");

  int64_t q[3] = {INT32_MIN, INT32_MAX, 5};
  memcpy(p, q, sizeof q);
  t = (ampc_st_tensor){"q", AMPC_DTYPE_I64, 1, {3}, p, 24};
  CHECK_OK(ampc_st_read_i32(&t, l, 3));
  CHECK(l[0] == INT32_MIN && l[1] == INT32_MAX && l[2] == 5);
  CHECK_ERR(ampc_st_read_f32(&t, v, 3), AMPC_EINVAL, "dtype I64 is not a float type");
  q[2] = (int64_t)INT32_MAX + 1;
  memcpy(p, q, sizeof q);
  CHECK_ERR(ampc_st_read_i32(&t, l, 3), AMPC_ERANGE, "tensor 'q': element 2 = 2147483648 does not fit in int32");
  q[2] = (int64_t)INT32_MIN - 1;
  memcpy(p, q, sizeof q);
  CHECK_ERR(ampc_st_read_i32(&t, l, 3), AMPC_ERANGE, "-2147483649 does not fit");

  int16_t s16[2] = {-32768, 32767};
  memcpy(p, s16, sizeof s16);
  t = (ampc_st_tensor){"s", AMPC_DTYPE_I16, 1, {2}, p, 4};
  CHECK_OK(ampc_st_read_i32(&t, l, 2));
  CHECK(l[0] == -32768 && l[1] == 32767);
  int32_t s32[1] = {-7};
  memcpy(p, s32, sizeof s32);
  t = (ampc_st_tensor){"i", AMPC_DTYPE_I32, 0, {0}, p, 4};
  CHECK_OK(ampc_st_read_i32(&t, l, 1));
  CHECK(l[0] == -7);
  const unsigned char bytes[3] = {0x80, 0xff, 2};
  t = (ampc_st_tensor){"i8", AMPC_DTYPE_I8, 1, {3}, bytes, 3};
  CHECK_OK(ampc_st_read_i32(&t, l, 3));
  CHECK(l[0] == -128 && l[1] == -1 && l[2] == 2);
  t.dtype = AMPC_DTYPE_U8;
  CHECK_OK(ampc_st_read_i32(&t, l, 3));
  CHECK(l[0] == 128 && l[1] == 255 && l[2] == 2);
  t.dtype = AMPC_DTYPE_BOOL;
  CHECK_OK(ampc_st_read_i32(&t, l, 3));
  CHECK(l[0] == 1 && l[1] == 1 && l[2] == 1);

  t = (ampc_st_tensor){"f", AMPC_DTYPE_F32, 1, {1}, ff, 4};
  CHECK_ERR(ampc_st_read_i32(&t, l, 1), AMPC_EINVAL, "dtype F32 is not an integer type");
  t.nbytes = 8;
  CHECK_ERR(ampc_st_read_f32(&t, v, 1), AMPC_EINVAL, "tensor 'f': inconsistent description");
  CHECK_ERR(ampc_st_read_f32(NULL, v, 1), AMPC_EINVAL, "tensor is NULL");
  t = (ampc_st_tensor){"n", AMPC_DTYPE_F32, 1, {-1}, ff, 4};
  CHECK(ampc_st_numel(&t) == -1);
  t = (ampc_st_tensor){"n", AMPC_DTYPE_F32, 9, {1}, ff, 4};
  CHECK(ampc_st_numel(&t) == -1);
  t = (ampc_st_tensor){"n", AMPC_DTYPE_F32, 0, {5}, ff, 4};
  CHECK(ampc_st_numel(&t) == 1);
}

TEST(write_invalid) {
  /* Every refused description leaves no file (and no temporary) behind. */
  float x[4] = {0};
  const char *path = TMP("invalid.safetensors");
  unlink(path);
  ampc_st_tensor t[2] = {{"a", AMPC_DTYPE_F32, 1, {4}, x, 16}, {"a", AMPC_DTYPE_F32, 1, {4}, x, 16}};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor name 'a' given twice");
  t[1].name = "__metadata__";
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "'__metadata__' is reserved");
  t[1].name = "\xff\xfe";
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 1: name is not valid UTF-8");
  t[1].name = NULL;
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 1 has no name");
  t[1] = (ampc_st_tensor){"b", AMPC_DTYPE_F32, 2, {2, 2}, x, 12};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 'b': nbytes 12 but F32 [2, 2] needs 16");
  t[1] = (ampc_st_tensor){"b", AMPC_DTYPE_F32, 1, {4}, NULL, 16};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 'b': data is NULL");
  t[1] = (ampc_st_tensor){"b", AMPC_DTYPE_COUNT, 1, {4}, x, 16};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 'b': invalid dtype");
  t[1] = (ampc_st_tensor){"b", AMPC_DTYPE_F32, 9, {4}, x, 16};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 'b': invalid shape");
  t[1] = (ampc_st_tensor){"b", AMPC_DTYPE_F32, 1, {-4}, x, 16};
  CHECK_ERR(ampc_st_write(path, t, 2, NULL), AMPC_EINVAL, "tensor 'b': invalid shape");
  const char *odd[] = {"k", NULL};
  CHECK_ERR(ampc_st_write(path, t, 1, odd), AMPC_EINVAL, "metadata key 'k' has no value");
  const char *dup[] = {"k", "1", "k", "2", NULL};
  CHECK_ERR(ampc_st_write(path, t, 1, dup), AMPC_EINVAL, "metadata key 'k' given twice");
  const char *badv[] = {"k", "\xc3", NULL};
  CHECK_ERR(ampc_st_write(path, t, 1, badv), AMPC_EINVAL, "metadata 'k': value is not valid UTF-8");
  CHECK_ERR(ampc_st_write(path, NULL, 1, NULL), AMPC_EINVAL, "tensors is NULL");
  CHECK_ERR(ampc_st_write(NULL, t, 1, NULL), AMPC_EINVAL, "path is NULL");
  CHECK(!exists(path));
  CHECK(count_temps(AMPC_TEST_TMPDIR, "invalid.safetensors") == 0);
  /* A folder that does not exist. */
  CHECK_ERR(ampc_st_write(TMP("no/such/dir/x.safetensors"), t, 1, NULL), AMPC_EIO,
            "cannot create a temporary file in");
}

/* A fetch callback that fails without a message of its own: the message
 * names the tensor, not whatever the thread's last one was */
static ampc_status failing_fetch(void *ctx, size_t i, void *buf) {
  (void)ctx, (void)i, (void)buf;
  return AMPC_EIO;
}
static ampc_status fetch_with_message(void *ctx, size_t i, void *buf) {
  (void)ctx, (void)i, (void)buf;
  return ampc__error(AMPC_EIO, "device read failed");
}
TEST(stream_fetch_failure_message) {
  const ampc_st_tensor t[2] = {{"first", AMPC_DTYPE_F32, 1, {2}, NULL, 8}, {"second", AMPC_DTYPE_F32, 1, {2}, NULL, 8}};
  ampc_st_file *f = NULL;
  CHECK(ampc_st_open(&f, TMP("no-such-file.safetensors")) < 0); /* an unrelated message first */
  CHECK_ERR(ampc_st_write_stream(TMP("stream.safetensors"), t, 2, NULL, failing_fetch, NULL), AMPC_EIO,
            "safetensors: tensor 'first': the fetch callback failed (status -3)");
  CHECK(strstr(ampc_last_error(), "no-such-file") == NULL);
  CHECK_ERR(ampc_st_write_stream(TMP("stream.safetensors"), t, 2, NULL, fetch_with_message, NULL), AMPC_EIO,
            "safetensors: device read failed");
}

TEST(write_failure_keeps_old_file) {
  const char *path = TMP("atomic.safetensors");
  float v1[4] = {1, 2, 3, 4};
  const ampc_st_tensor t1 = {"w", AMPC_DTYPE_F32, 1, {4}, v1, sizeof v1};
  CHECK_OK(ampc_st_write(path, &t1, 1, NULL));
  size_t old_len;
  unsigned char *old = slurp(path, &old_len);
  CHECK(old != NULL);
  if (!old) return;

  /* A bigger new version; its size tells where the interesting failure
   * points are: the length field, the header, the data, the last byte. */
  float v2[300];
  for (int i = 0; i < 300; i++) v2[i] = (float)i * 0.5f;
  const ampc_st_tensor t2[2] = {{"w", AMPC_DTYPE_F32, 1, {300}, v2, sizeof v2},
                                {"b", AMPC_DTYPE_F32, 1, {4}, v1, sizeof v1}};
  const char *meta[] = {"step", "7", NULL};
  CHECK_OK(ampc_st_write(TMP("atomic_probe.safetensors"), t2, 2, meta));
  size_t new_len;
  unsigned char *probe = slurp(TMP("atomic_probe.safetensors"), &new_len);
  free(probe);
  CHECK(new_len > 1200);

  const long long at[] = {0, 1, 7, 8, 20, 100, (long long)new_len / 2, (long long)new_len - 1};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    ampc__fsutil_fail_after(at[i]);
    CHECK_ERR(ampc_st_write(path, t2, 2, meta), AMPC_EIO, "No space left on device");
    const char *msg = ampc_last_error();
    CHECK_MSG(strncmp(msg, "safetensors: ", 13) == 0 && strstr(msg, path) && strstr(msg, "was not changed"),
              "fail at %lld: %s", at[i], msg);
    char want[64];
    snprintf(want, sizeof want, "write failed after %lld bytes", at[i]);
    CHECK_MSG(strstr(msg, want) != NULL, "fail at %lld: %s", at[i], msg);
    size_t len;
    unsigned char *now = slurp(path, &len);
    CHECK_MSG(now && len == old_len && memcmp(now, old, len) == 0, "fail at %lld: old file damaged", at[i]);
    free(now);
    CHECK_MSG(count_temps(AMPC_TEST_TMPDIR, "atomic.safetensors") == 0, "fail at %lld: temp left", at[i]);
  }
  /* The hook disarms itself after firing: the next write succeeds. */
  CHECK_OK(ampc_st_write(path, t2, 2, meta));
  ampc_st_file *f = NULL;
  CHECK_OK(ampc_st_open(&f, path));
  CHECK(f && ampc_st_count(f) == 2 && strcmp(ampc_st_metadata(f, "step"), "7") == 0);
  CHECK(f && ampc_st_find(f, "w") && ampc_st_find(f, "w")->nbytes == sizeof v2);
  ampc_st_close(f);
  /* A budget of exactly the file size is not a failure. */
  ampc__fsutil_fail_after((long long)new_len);
  CHECK_OK(ampc_st_write(path, t2, 2, meta));
  ampc__fsutil_fail_after(-1);
  CHECK(count_temps(AMPC_TEST_TMPDIR, "atomic.safetensors") == 0);
  free(old);
}

static ampc_status fill_then_fail(void *ctx, ampc__wfile *w) {
  AMPC_TRY(ampc__wfile_write(w, "partial", 7));
  return ampc__error(AMPC_EINVAL, "producer gave up after %llu bytes", (unsigned long long)ampc__wfile_tell(w));
}

static ampc_status fill_hello(void *ctx, ampc__wfile *w) { return ampc__wfile_write(w, ctx, 5); }

TEST(atomic_write_errors) {
  const char *path = TMP("atomic_raw.bin");
  CHECK_OK(ampc__write_file_atomic(path, fill_hello, "hello"));
  size_t len;
  unsigned char *b = slurp(path, &len);
  CHECK(b && len == 5 && memcmp(b, "hello", 5) == 0);
  free(b);
  /* A failing producer aborts the write; its own error is kept. */
  CHECK_ERR(ampc__write_file_atomic(path, fill_then_fail, NULL), AMPC_EINVAL, "producer gave up after 7 bytes");
  b = slurp(path, &len);
  CHECK(b && len == 5 && memcmp(b, "hello", 5) == 0);
  free(b);
  CHECK(count_temps(AMPC_TEST_TMPDIR, "atomic_raw.bin") == 0);
  /* A target that is a folder or a FIFO is refused, not replaced (as root
   * the rename would replace a device node or a FIFO: /dev/null itself). */
  const char *dir = TMP("atomic_dir");
  mkdir(dir, 0777);
  char inner[512];
  snprintf(inner, sizeof inner, "%s/keep", dir);
  CHECK(spit(inner, "x", 1) == 0);
  CHECK_ERR(ampc__write_file_atomic(dir, fill_hello, "hello"), AMPC_EINVAL, "exists and is not a regular file (a folder)");
  CHECK(count_temps(AMPC_TEST_TMPDIR, "atomic_dir") == 0);
  const char *fifo = TMP("atomic_fifo");
  unlink(fifo);
  CHECK(mkfifo(fifo, 0666) == 0);
  CHECK_ERR(ampc__write_file_atomic(fifo, fill_hello, "hello"), AMPC_EINVAL, "exists and is not a regular file (a FIFO); not replaced");
  struct stat fst;
  CHECK(stat(fifo, &fst) == 0 && S_ISFIFO(fst.st_mode));
  unlink(fifo);
  CHECK_ERR(ampc__write_file_atomic(TMP("x/"), fill_hello, "hello"), AMPC_EINVAL, "path names a folder");
  const ampc__chunk ch[3] = {{"ab", 2}, {NULL, 0}, {"cd", 2}};
  CHECK_OK(ampc__write_file_atomic_chunks(path, ch, 3));
  b = slurp(path, &len);
  CHECK(b && len == 4 && memcmp(b, "abcd", 4) == 0);
  free(b);
}

/* A FIFO is refused at once, not waited on (it has no writer here); the
 * header alone can be read and checked without the data. */
TEST(special_files_and_header_only) {
  unlink(TMP("fifo.safetensors"));
  CHECK(mkfifo(TMP("fifo.safetensors"), 0644) == 0);
  ampc_st_file *f = (ampc_st_file *)1;
  CHECK_ERR(ampc_st_open(&f, TMP("fifo.safetensors")), AMPC_EIO, "fifo.safetensors: not a regular file");
  CHECK(f == NULL);
  CHECK_ERR(ampc_st_open_header(&f, TMP("fifo.safetensors")), AMPC_EIO, "not a regular file");
  CHECK_ERR(ampc_st_open(&f, AMPC_TEST_TMPDIR), AMPC_EIO, "not a regular file");
  unlink(TMP("fifo.safetensors"));
  float v[3] = {1, 2, 3};
  ampc_st_tensor t = {.name = "w", .dtype = AMPC_DTYPE_F32, .ndim = 1, .shape = {3}, .values = v, .nbytes = sizeof v};
  const char *meta[] = {"input", "1x2x3", NULL};
  CHECK_OK(ampc_st_write(TMP("header_only.safetensors"), &t, 1, meta));
  CHECK_OK(ampc_st_open_header(&f, TMP("header_only.safetensors")));
  const ampc_st_tensor *w = ampc_st_find(f, "w");
  CHECK(w && w->values == NULL && w->nbytes == 12 && w->shape[0] == 3);
  CHECK(strcmp(ampc_st_metadata(f, "input"), "1x2x3") == 0);
  float out[3];
  CHECK(ampc_st_read_f32(w, out, 3) == AMPC_EINVAL);
  ampc_st_close(f);
}

TEST_MAIN(TEST_ENTRY(special_files_and_header_only), TEST_ENTRY(stream_fetch_failure_message), TEST_ENTRY(roundtrip_all_dtypes), TEST_ENTRY(write_exact_bytes), TEST_ENTRY(known_bytes),
          TEST_ENTRY(python_fixture), TEST_ENTRY(bad_inputs), TEST_ENTRY(bad_lengths),
          TEST_ENTRY(bad_files), TEST_ENTRY(read_conversions), TEST_ENTRY(write_invalid),
          TEST_ENTRY(write_failure_keeps_old_file), TEST_ENTRY(atomic_write_errors))
