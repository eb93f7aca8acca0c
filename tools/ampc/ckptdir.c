/* Checkpoint folders: one writer at a time, leftovers of killed saves, the
 * list of complete checkpoints.
 *
 * A run that writes into a folder holds an exclusive flock on DIR/.lock for
 * as long as the process lives (the kernel drops it when the process ends,
 * however it ends, so a kill -9 leaves no stale lock), with its pid in the
 * file for the message a second run gets. Holding the lock, the run owns the
 * folder: the temporary files of an earlier run's interrupted save
 * (".ckpt-step-N.safetensors.tmp.<pid>.<n>", see src/io/fsutil.c) can only
 * be leftovers, and are removed -- unless their pid is a live process, which
 * then writes there without taking the lock (an older ampc), and is left
 * alone. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptdir.h"
#include "cli.h"

#define CKPT_PREFIX "ckpt-step-"
#define CKPT_SUFFIX ".safetensors"
#define LOCK_NAME ".lock"

int cli_checkpoint_step(const char *name, long long *step) {
  /* "ckpt-step-", 1 to 18 digits (no sign or space), ".safetensors" */
  size_t np = strlen(CKPT_PREFIX), nd = 0;
  if (strncmp(name, CKPT_PREFIX, np) != 0) return 0;
  long long v = 0;
  for (const char *p = name + np; *p >= '0' && *p <= '9'; p++, nd++) {
    if (nd == 18) return 0;
    v = v * 10 + (*p - '0');
  }
  if (nd == 0 || strcmp(name + np + nd, CKPT_SUFFIX) != 0) return 0;
  *step = v;
  return 1;
}

void cli_checkpoint_path(char *out, size_t len, const char *dir, long long step) {
  snprintf(out, len, "%s/" CKPT_PREFIX "%08lld" CKPT_SUFFIX, dir, step);
}

/* 1 if dir/name is a regular file (a complete checkpoint, not a folder or a FIFO of that name). */
static int is_regular(const char *dir, const char *name) {
  char p[4096];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int cli_latest_checkpoint(const char *dir, char *out, size_t len) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  long long best = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long st;
    if (cli_checkpoint_step(e->d_name, &st) && st > best && is_regular(dir, e->d_name)) {
      best = st;
      snprintf(out, len, "%s/%s", dir, e->d_name);
    }
  }
  closedir(d);
  return best >= 0 ? 0 : -1;
}

void cli_prune_checkpoints(const char *dir, int keep) {
  for (;;) {
    DIR *d = opendir(dir);
    if (!d) return;
    long long oldest = -1;
    int count = 0;
    char name[4096] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
      long long st;
      /* only complete checkpoints count: not the temporary files of a save */
      if (cli_checkpoint_step(e->d_name, &st) && is_regular(dir, e->d_name)) {
        count++;
        if (oldest < 0 || st < oldest) {
          oldest = st;
          snprintf(name, sizeof name, "%s/%s", dir, e->d_name);
        }
      }
    }
    closedir(d);
    if (count <= keep || !name[0]) return;
    if (unlink(name) != 0) return;
  }
}

/* The pid of a temporary checkpoint file's writer: ".ckpt-step-N.safetensors.tmp.<pid>.<n>". */
static int leftover_pid(const char *name, long *pid) {
  static const char head[] = "." CKPT_PREFIX;
  if (strncmp(name, head, sizeof head - 1) != 0) return 0;
  const char *t = strstr(name, CKPT_SUFFIX ".tmp.");
  if (!t) return 0;
  t += strlen(CKPT_SUFFIX ".tmp.");
  char *end;
  errno = 0;
  long p = strtol(t, &end, 10);
  if (errno || end == t || *end != '.' || p <= 0) return 0;
  *pid = p;
  return 1;
}

/* Removes the leftovers of interrupted saves; returns how many. */
static int remove_leftovers(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid;
    if (!leftover_pid(e->d_name, &pid)) continue;
    if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) continue; /* a live writer */
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) removed++;
  }
  closedir(d);
  return removed;
}

/* What cli_ckptdir_lock made, for cli_ckptdir_abandon: the folder it locked,
 * the topmost folder it created on the way there ("" if none), and whether
 * the lock file was new. */
static struct {
  char dir[4096], made_top[4096];
  int made_lock;
} made;

/* mkdir -p; top (when not NULL, sizeof made.made_top long) gets the
 * topmost folder this call created, "" if none. */
static int mkdirs(const char *dir, char *top) {
  char p[4096];
  size_t n = strlen(dir);
  if (top) top[0] = '\0';
  if (n == 0 || n >= sizeof p) {
    errno = n ? ENAMETOOLONG : ENOENT;
    return -1;
  }
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (i < n && (p[i] != '/' || p[i - 1] == '/')) continue;
    char keep = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) == 0) {
      if (top && !top[0]) memcpy(top, p, i + 1);
    } else if (errno != EEXIST) {
      return -1;
    }
    p[i] = keep;
  }
  return 0;
}

int cli_mkdirs(const char *dir) { return mkdirs(dir, NULL); }

/* cli_ckptdir_lock; where another run holds the lock and busy_quiet is
 * set, -2 and no message */
static int lock_dir(const char *flag, const char *dir, int busy_quiet) {
  made.dir[0] = '\0';
  made.made_lock = 0;
  if (mkdirs(dir, made.made_top) != 0) {
    cli_error("%s: cannot create '%s': %s", flag, dir, strerror(errno));
    return -1;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    cli_error("%s: '%s' is not a folder", flag, dir);
    return -1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
  /* O_NONBLOCK: a FIFO of that name must not hang us */
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, 0666), fresh = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP) {
    cli_error("%s: %s is a symbolic link, not ampc's lock file", flag, path);
    return -1;
  }
  if (fd < 0 && errno == EISDIR) {
    cli_error("%s: %s is a folder, not ampc's lock file", flag, path);
    return -1;
  }
  if (fd < 0) {
    cli_error("%s: cannot write into '%s': %s", flag, dir, strerror(errno));
    return -1;
  }
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    cli_error("%s: %s is not a regular file", flag, path);
    close(fd);
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[32] = "";
    ssize_t n = e == EWOULDBLOCK ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    close(fd);
    if (e == EWOULDBLOCK && busy_quiet) return -2;
    if (e != EWOULDBLOCK) {
      cli_error("%s: cannot lock %s: %s", flag, path, strerror(e));
      return -1;
    }
    if (pid > 0)
      cli_error("%s: '%s' is in use by another ampc run (pid %ld holds %s)", flag, dir, pid, path);
    else
      cli_error("%s: '%s' is in use by another ampc run (it holds %s)", flag, dir, path);
    return -1;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    cli_error("%s: cannot write into '%s': %s", flag, dir, strerror(errno));
    close(fd);
    return -1;
  }
  /* the lock file may be an old one: make sure a new file can be made there now,
   * rather than at the first save */
  char probe[4096];
  snprintf(probe, sizeof probe, "%s/.ampc-write-test.%ld", dir, (long)getpid());
  int pf = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (pf < 0) {
    cli_error("%s: cannot write into '%s': %s", flag, dir, strerror(errno));
    close(fd);
    return -1;
  }
  close(pf);
  unlink(probe);
  snprintf(made.dir, sizeof made.dir, "%s", dir);
  made.made_lock = fresh;
  int removed = remove_leftovers(dir);
  if (removed) /* even with --quiet: files were deleted */
    fprintf(stderr, "ampc: removed %d unfinished checkpoint file%s left in %s by an interrupted save\n", removed, removed == 1 ? "" : "s", cli_shown(dir));
  return fd; /* held, with the lock, until the process ends */
}

int cli_ckptdir_lock(const char *flag, const char *dir) { return lock_dir(flag, dir, 0); }

int cli_ckptdir_owns(const char *dir, const char *path) {
  if (!dir || !path) return 0;
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  long long step;
  long pid;
  static const char probe[] = ".ampc-write-test.";
  if (!cli_checkpoint_step(base, &step) && strcmp(base, LOCK_NAME) != 0 && !leftover_pid(base, &pid) &&
      strncmp(base, probe, sizeof probe - 1) != 0)
    return 0;
  char parent[4096];
  int n = !slash ? snprintf(parent, sizeof parent, ".")
          : slash == path ? snprintf(parent, sizeof parent, "/")
                          : snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
  return n > 0 && (size_t)n < sizeof parent && cli_same_file(parent, dir);
}

int cli_ckptdir_fits(const char *dir, const char *resume, char *latest, size_t len) {
  if (cli_latest_checkpoint(dir, latest, len) < 0) return 1;
  return resume && resume[0] && cli_same_file(latest, resume);
}

int cli_ckptdir_default(const char *resume, char *out, size_t len) {
  for (int i = 0; i < 100; i++) {
    if (i) snprintf(out, len, "checkpoints.%d", i);
    else snprintf(out, len, "checkpoints");
    struct stat sb;
    char latest[4096];
    if (stat(out, &sb) == 0 && !S_ISDIR(sb.st_mode)) continue; /* a file of that name */
    if (!cli_ckptdir_fits(out, resume, latest, sizeof latest)) continue;
    int fd = lock_dir("saving a checkpoint", out, 1);
    if (fd == -2) continue; /* another run's, which has not saved yet */
    return fd < 0 ? -1 : 0;
  }
  cli_error("saving a checkpoint: ./checkpoints and ./checkpoints.1 to .99 are all in use by other runs; give --checkpoint-dir DIR");
  return -1;
}

void cli_ckptdir_abandon(void) {
  if (!made.dir[0]) return;
  DIR *d = opendir(made.dir);
  if (!d) return;
  int other = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && strcmp(e->d_name, LOCK_NAME) != 0) other = 1;
  closedir(d);
  if (other || !made.made_lock) return;
  char path[4096 + sizeof LOCK_NAME + 1];
  snprintf(path, sizeof path, "%s/" LOCK_NAME, made.dir);
  if (unlink(path) != 0 || !made.made_top[0]) return;
  /* the folders this run made, deepest first; rmdir leaves any that are not empty */
  size_t top = strlen(made.made_top);
  char p[4096];
  snprintf(p, sizeof p, "%s", made.dir);
  for (size_t n = strlen(p); n >= top && n > 0;) {
    while (n > top && p[n - 1] == '/') p[--n] = '\0'; /* a trailing slash */
    if (rmdir(p) != 0) return;
    char *slash = strrchr(p, '/');
    if (!slash || (size_t)(slash - p) < top) return;
    *slash = '\0';
    n = (size_t)(slash - p);
  }
  made.dir[0] = '\0';
}
