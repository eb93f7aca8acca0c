/* libFuzzer target: `ampc report` (tools/ampc/report.c) on fuzzed metrics
 * files -- the JSON Lines reader (epoch and step records, their ranges,
 * duplicates from resumed runs), the charts' scales and ticks, and the page.
 *
 * The input is one or two metrics files: the bytes up to the first form feed
 * (0x0c) are the first run, the rest (when there is a form feed) a second,
 * so the multi-run charts are reached too. The page goes to standard output,
 * which the target points at /dev/null with stderr (AMPC_FUZZ_VERBOSE=1
 * keeps them). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_report(int argc, char **argv);
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path_a[512], path_b[512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > 400) tmp = "/tmp";
  snprintf(path_a, sizeof path_a, "%s/ampc-fuzz-report-%ld-a.jsonl", tmp, (long)getpid());
  snprintf(path_b, sizeof path_b, "%s/ampc-fuzz-report-%ld-b.jsonl", tmp, (long)getpid());
  const char *v = getenv("AMPC_FUZZ_VERBOSE");
  if (v && *v && strcmp(v, "0") != 0) return 0;
  FILE *null = fopen("/dev/null", "w");
  if (null) {
    stdout = null;
    stderr = null;
  }
  return 0;
}

static int put(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *ff = memchr(data, '\f', size);
  size_t na = ff ? (size_t)(ff - data) : size;
  if (put(path_a, data, na) < 0) return 0;
  char a0[] = "--title", a1[] = "fuzz <&>\"", a2[] = "-o", a3[] = "-";
  char *argv[] = {a0, a1, a2, a3, path_a, path_b, NULL};
  int argc = 5;
  if (ff) {
    if (put(path_b, ff + 1, size - na - 1) < 0) return 0;
    argc = 6;
  }
  (void)cmd_report(argc, argv);
  unlink(path_a);
  if (ff) unlink(path_b);
  return 0;
}
