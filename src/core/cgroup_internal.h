/* What the process's control groups allow it (cgroup.c). */
#ifndef AMPC_CGROUP_INTERNAL_H
#define AMPC_CGROUP_INTERNAL_H

#include <stdint.h>

/* The CPUs a CPU quota allows (cgroup v2's cpu.max, v1's cpu.cfs_quota_us
 * over cpu.cfs_period_us; the tightest from the process's group up to the
 * root), rounded up; 0 where there is none. AMPC_TEST_CGROUP (a test
 * hook) names a directory whose files stand for the process's group. */
int ampc__cgroup_cpus(void);
/* The bytes a memory limit allows (v2's memory.max, v1's
 * memory.limit_in_bytes; the tightest up to the root); 0 where none. */
uint64_t ampc__cgroup_memory(void);
/* The same for the groups file proc lists (as /proc/self/cgroup does) with
 * the hierarchies mounted in root (as /sys/fs/cgroup): for the tests. */
int ampc__cgroup_cpus_at(const char *proc, const char *root);
uint64_t ampc__cgroup_memory_at(const char *proc, const char *root);

#endif
