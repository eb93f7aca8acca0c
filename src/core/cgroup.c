/* What the process's control groups allow it: a CPU quota (the default
 * thread count stays within it) and a memory limit (a plan past it is an
 * error, not a process the kernel kills as it touches the pages). Each is
 * the tightest limit from the process's own group up to the root of its
 * hierarchy: cgroup v2 (cpu.max, memory.max) or v1 (cpu.cfs_quota_us over
 * cpu.cfs_period_us, memory.limit_in_bytes). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cgroup_internal.h"

typedef enum { CG_CPU, CG_MEM } cg_kind;

/* Up to two numbers of file dir/name (0, 1 or 2 read; "max" reads as -1). */
static int read_numbers(const char *dir, const char *name, long long v[2]) {
  char path[4200], a[64] = "", b[64] = "";
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = fscanf(f, "%63s %63s", a, b);
  fclose(f);
  const char *s[2] = {a, b};
  for (int i = 0; i < n && i < 2; i++) {
    char *end;
    v[i] = strcmp(s[i], "max") == 0 ? -1 : strtoll(s[i], &end, 10);
    if (strcmp(s[i], "max") != 0 && (end == s[i] || *end)) return i;
  }
  return n < 0 ? 0 : n;
}

/* The limit directory dir sets (CPUs rounded up, or bytes), 0 for none. */
static uint64_t dir_limit(const char *dir, cg_kind k, int v2) {
  long long v[2] = {-1, -1};
  if (k == CG_CPU) {
    long long quota, period;
    if (v2) {
      if (read_numbers(dir, "cpu.max", v) != 2) return 0;
      quota = v[0], period = v[1];
    } else {
      if (read_numbers(dir, "cpu.cfs_quota_us", v) != 1) return 0;
      quota = v[0];
      if (read_numbers(dir, "cpu.cfs_period_us", v) != 1) return 0;
      period = v[0];
    }
    /* (the kernel takes periods of 1 ms to 1 s: anything far past is not a quota) */
    if (quota <= 0 || period <= 0 || period > (1LL << 40) || quota / period >= (1 << 20)) return 0;
    return (uint64_t)((quota + period - 1) / period);
  }
  if (read_numbers(dir, v2 ? "memory.max" : "memory.limit_in_bytes", v) != 1) return 0;
  /* v1 writes "no limit" as the largest page multiple below 2^63 */
  return v[0] > 0 && v[0] < (1LL << 60) ? (uint64_t)v[0] : 0;
}

static uint64_t tighter(uint64_t a, uint64_t b) { return a == 0 ? b : b == 0 ? a : a < b ? a : b; }

/* The tightest from group rel (under the hierarchy mounted at mnt) up to
 * the root: inside a container the mount is often the container's own
 * group, where a path named above it does not exist. */
static uint64_t path_limit(const char *mnt, const char *rel, cg_kind k, int v2) {
  char dir[4200];
  int n = snprintf(dir, sizeof dir, "%s%s", mnt, rel);
  if (n < 0 || (size_t)n >= sizeof dir) return 0;
  size_t base = strlen(mnt);
  uint64_t best = 0;
  for (;;) {
    size_t len = strlen(dir);
    while (len > base && dir[len - 1] == '/') dir[--len] = '\0';
    best = tighter(best, dir_limit(dir, k, v2));
    char *slash = strrchr(dir + base, '/');
    if (!slash) break;
    *slash = '\0';
  }
  return best;
}

/* The limit from the groups proc lists (as /proc/self/cgroup does) under
 * the hierarchies mounted in root (as /sys/fs/cgroup). */
static uint64_t limit_at(const char *proc, const char *root, cg_kind k) {
  FILE *f = fopen(proc, "r");
  if (!f) return 0;
  char line[4096];
  uint64_t best = 0;
  const char *ctrl = k == CG_CPU ? "cpu" : "memory";
  while (fgets(line, sizeof line, f)) {
    /* hierarchy-ID:controllers:path */
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    char *rel = c2 + 1;
    rel[strcspn(rel, "\n")] = '\0';
    if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1) { /* "0::path": v2 */
      char unified[4200];
      snprintf(unified, sizeof unified, "%s/unified", root);
      best = tighter(best, path_limit(root, rel, k, 1));
      best = tighter(best, path_limit(unified, rel, k, 1));
      continue;
    }
    int has = 0;
    char *save = NULL;
    for (char *t = strtok_r(c1 + 1, ",", &save); t; t = strtok_r(NULL, ",", &save)) has |= strcmp(t, ctrl) == 0;
    if (!has) continue;
    char mnt[4200];
    snprintf(mnt, sizeof mnt, "%s/%s", root, ctrl);
    best = tighter(best, path_limit(mnt, rel, k, 0));
    snprintf(mnt, sizeof mnt, "%s/cpu,cpuacct", root);
    if (k == CG_CPU) best = tighter(best, path_limit(mnt, rel, k, 0));
  }
  fclose(f);
  return best;
}

static uint64_t cgroup_limit(cg_kind k) {
  /* a test hook: a directory standing for the process's group */
  const char *test = getenv("AMPC_TEST_CGROUP");
  if (test) return tighter(dir_limit(test, k, 1), dir_limit(test, k, 0));
  return limit_at("/proc/self/cgroup", "/sys/fs/cgroup", k);
}

int ampc__cgroup_cpus(void) { return (int)cgroup_limit(CG_CPU); }
uint64_t ampc__cgroup_memory(void) { return cgroup_limit(CG_MEM); }
int ampc__cgroup_cpus_at(const char *proc, const char *root) { return (int)limit_at(proc, root, CG_CPU); }
uint64_t ampc__cgroup_memory_at(const char *proc, const char *root) { return limit_at(proc, root, CG_MEM); }
