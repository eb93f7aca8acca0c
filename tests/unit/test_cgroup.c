/* The control-group limits (src/core/cgroup.c) read from made-up cgroup
 * trees: v2 (one hierarchy, "0::path"), v1 (a hierarchy per controller),
 * a container's view (the path named above its own group is not there),
 * and the tightest limit on the way up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cgroup_internal.h"
#include "test.h"

static char root[256];

static void put(const char *rel, const char *text) {
  char path[512], dir[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  /* every directory on the way */
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    snprintf(dir, sizeof dir, "%.*s", (int)(p - path), path);
    mkdir(dir, 0755);
  }
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}
/* root/rel, in one of two buffers in turn (a call takes two) */
static const char *at(const char *rel) {
  static char path[2][512];
  static int k;
  k ^= 1;
  snprintf(path[k], sizeof path[k], "%s/%s", root, rel);
  return path[k];
}
static void fresh(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0);
  mkdir(root, 0755);
}

TEST(cgroup_v2) {
  snprintf(root, sizeof root, "/tmp/ampc_cgroup_test.%d", (int)getpid());
  fresh();
  put("proc", "0::/user/job\n");
  put("sys/user/job/cpu.max", "150000 100000\n");
  put("sys/user/job/memory.max", "max\n");
  put("sys/user/memory.max", "1073741824\n");
  put("sys/user/cpu.max", "max 100000\n");
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 2);                  /* 1.5 CPUs, rounded up */
  CHECK(ampc__cgroup_memory_at(at("proc"), at("sys")) == 1073741824ULL); /* the parent's */
  put("sys/cpu.max", "100000 100000\n"); /* the root's, tighter */
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 1);
  /* none anywhere */
  fresh();
  put("proc", "0::/\n");
  put("sys/cpu.max", "max 100000\n");
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 0);
  CHECK(ampc__cgroup_memory_at(at("proc"), at("sys")) == 0);
  /* no such file, a malformed one */
  CHECK(ampc__cgroup_cpus_at(at("none"), at("sys")) == 0);
  put("sys/cpu.max", "lots 100000\n");
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 0);
  put("sys/cpu.max", "4611686018427387904 4611686018427387904\n"); /* 2^62 over 2^62: no overflow, not a quota */
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 0);
  put("sys/cpu.max", "100000000000000000000 100000\n"); /* past long long */
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 0);
  fresh();
  rmdir(root);
}

TEST(cgroup_v1) {
  snprintf(root, sizeof root, "/tmp/ampc_cgroup_test.%d", (int)getpid());
  fresh();
  /* a hybrid machine: v1 controllers, an empty v2 hierarchy beside them */
  put("proc", "9:memory:/a/b\n4:cpu,cpuacct:/a/b\n0::/\n");
  put("sys/cpu,cpuacct/a/b/cpu.cfs_quota_us", "-1\n");
  put("sys/cpu,cpuacct/a/b/cpu.cfs_period_us", "100000\n");
  put("sys/cpu,cpuacct/a/cpu.cfs_quota_us", "250000\n");
  put("sys/cpu,cpuacct/a/cpu.cfs_period_us", "100000\n");
  put("sys/memory/a/b/memory.limit_in_bytes", "536870912\n");
  put("sys/memory/memory.limit_in_bytes", "9223372036854771712\n"); /* v1's "no limit" */
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 3);
  CHECK(ampc__cgroup_memory_at(at("proc"), at("sys")) == 536870912ULL);
  /* a container's view: its own group mounted as the root, the path named
   * above it missing there */
  fresh();
  put("proc", "4:cpu:/docker/abc\n9:memory:/docker/abc\n");
  put("sys/cpu/cpu.cfs_quota_us", "200000\n");
  put("sys/cpu/cpu.cfs_period_us", "100000\n");
  put("sys/memory/memory.limit_in_bytes", "2147483648\n");
  CHECK(ampc__cgroup_cpus_at(at("proc"), at("sys")) == 2);
  CHECK(ampc__cgroup_memory_at(at("proc"), at("sys")) == 2147483648ULL);
  fresh();
  rmdir(root);
}

TEST_MAIN(TEST_ENTRY(cgroup_v2), TEST_ENTRY(cgroup_v1))
