/* fs.c — whole-file reads, durable writes (Redis rdbSave recipe), paths. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/base.h"

st_status st_fs_read_file(const char* path, char** out_data, size_t* out_size) {
  *out_data = NULL;
  *out_size = 0;
  FILE* f = fopen(path, "rb");
  if (!f) return st_status_make(ST_CODE_IO, "cannot open '%s': %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return st_status_make(ST_CODE_IO, "cannot seek '%s': %s", path, strerror(errno));
  }
  long n = ftell(f);
  if (n < 0) {
    fclose(f);
    return st_status_make(ST_CODE_IO, "'%s' is not a regular file", path);
  }
  rewind(f);
  char* data = st_xmalloc((size_t)n + 1);
  size_t got = fread(data, 1, (size_t)n, f);
  int err = ferror(f);
  fclose(f);
  if (err || got != (size_t)n) {
    free(data);
    return st_status_make(ST_CODE_IO, "short read of '%s' (%zu of %ld bytes)", path, got, n);
  }
  data[n] = '\0';
  *out_data = data;
  *out_size = (size_t)n;
  return ST_OK;
}

static st_status st__fsync_dir_of(const char* path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s", path);
  char* slash = strrchr(dir, '/');
  if (slash == dir) {
    dir[1] = '\0';
  } else if (slash) {
    *slash = '\0';
  } else {
    snprintf(dir, sizeof(dir), ".");
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return st_status_make(ST_CODE_IO, "cannot open folder '%s': %s", dir, strerror(errno));
  int rc = fsync(fd);
  int saved = errno;
  close(fd);
  if (rc != 0) return st_status_make(ST_CODE_IO, "fsync of folder '%s' failed: %s", dir, strerror(saved));
  return ST_OK;
}

st_status st_fs_write_all(int fd, const void* data, size_t size, const char* path) {
  const char* p = data;
  while (size > 0) {
    ssize_t w = write(fd, p, size);
    if (w < 0) {
      if (errno == EINTR) continue;
      return st_status_make(ST_CODE_IO, "write to '%s' failed: %s", path, strerror(errno));
    }
    p += w;
    size -= (size_t)w;
  }
  return ST_OK;
}

st_status st_fs_write_atomic_pieces(const char* path, const st_fs_piece* pieces, int count) {
  /* A unique temporary name (mkostemp), not one per process: two threads
   * (e.g. a batch compile filling the executable cache) may write at once. */
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp-%ld-XXXXXX", path, (long)getpid()) >= (int)sizeof(tmp))
    return st_status_make(ST_CODE_IO, "path too long: '%s'", path);
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) return st_status_make(ST_CODE_IO, "cannot create '%s': %s", tmp, strerror(errno));
  (void)fchmod(fd, 0644); /* mkostemp makes 0600; these files are shared like any output */
  st_status s = ST_OK;
  for (int i = 0; i < count && !s; ++i) s = st_fs_write_all(fd, pieces[i].data, pieces[i].size, tmp);
  if (s) {
    close(fd);
    unlink(tmp);
    return s;
  }
  if (fsync(fd) != 0) {
    int saved = errno;
    close(fd);
    unlink(tmp);
    return st_status_make(ST_CODE_IO, "fsync of '%s' failed: %s", tmp, strerror(saved));
  }
  if (close(fd) != 0) {
    int saved = errno;
    unlink(tmp);
    return st_status_make(ST_CODE_IO, "close of '%s' failed: %s", tmp, strerror(saved));
  }
  if (rename(tmp, path) != 0) {
    int saved = errno;
    unlink(tmp);
    return st_status_make(ST_CODE_IO, "rename '%s' -> '%s' failed: %s", tmp, path, strerror(saved));
  }
  return st__fsync_dir_of(path);
}

st_status st_fs_write_atomic(const char* path, const void* data, size_t size) {
  st_fs_piece piece = {data, size};
  return st_fs_write_atomic_pieces(path, &piece, 1);
}

st_status st_fs_lock(const char* path, int* out_fd, long* out_holder) {
  *out_fd = -1;
  *out_holder = 0;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return st_status_make(ST_CODE_IO, "cannot open lock file '%s': %s", path, strerror(errno));
  int rc;
  while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    int saved = errno;
    if (saved == ENOLCK || saved == EOPNOTSUPP || saved == ENOSYS) {
      /* Some network filesystems have no flock: run unlocked, say so. */
      close(fd);
      *out_holder = -1;
      return ST_OK;
    }
    if (saved != EWOULDBLOCK) {
      close(fd);
      return st_status_make(ST_CODE_IO, "cannot lock '%s': %s", path, strerror(saved));
    }
    char buf[32] = {0};
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    if (n > 0) *out_holder = strtol(buf, NULL, 10);
    close(fd);
    return ST_OK;
  }
  /* The pid is for error messages only; the lock itself is the flock. */
  char pid[32];
  int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    int saved = errno;
    close(fd);
    return st_status_make(ST_CODE_IO, "cannot write lock file '%s': %s", path, strerror(saved));
  }
  *out_fd = fd;
  return ST_OK;
}

st_status st_fs_lock_probe(const char* path, long* out_holder) {
  *out_holder = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return ST_OK;
    return st_status_make(ST_CODE_IO, "cannot open lock file '%s': %s", path, strerror(errno));
  }
  int rc;
  while ((rc = flock(fd, LOCK_SH | LOCK_NB)) != 0 && errno == EINTR) {
  }
  st_status s = ST_OK;
  if (rc == 0) {
    (void)flock(fd, LOCK_UN);
  } else if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {
    *out_holder = -1;
  } else if (errno == EWOULDBLOCK) {
    char buf[32] = {0};
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    *out_holder = pid > 0 ? pid : -2;
  } else {
    s = st_status_make(ST_CODE_IO, "cannot probe lock '%s': %s", path, strerror(errno));
  }
  close(fd);
  return s;
}

#define ST__LOCK_FD_ENV "STRATA_RUN_LOCK_FD"

int st_fs_lock_inherited(const char* path) {
  const char* e = getenv(ST__LOCK_FD_ENV);
  if (!e || !e[0]) return -1;
  char* end = NULL;
  long fd = strtol(e, &end, 10);
  struct stat a, b;
  if (*end || fd < 3 || fd > 1 << 20 || fstat((int)fd, &a) != 0 || stat(path, &b) != 0) return -1;
  if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) return -1;
  /* On the shared description the lock is already ours: this succeeds. */
  if (flock((int)fd, LOCK_EX | LOCK_NB) != 0) return -1;
  (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
  return (int)fd;
}

#define ST__LOCK_PID_ENV "STRATA_RUN_LOCK_PID"

void st_fs_lock_hand_down(int fd) {
  if (fd < 0) return;
  (void)fcntl(fd, F_SETFD, 0);
  char num[24];
  snprintf(num, sizeof(num), "%d", fd);
  setenv(ST__LOCK_FD_ENV, num, 1);
  snprintf(num, sizeof(num), "%ld", (long)getppid());
  setenv(ST__LOCK_PID_ENV, num, 1);
}

/* The parent of |pid| from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm
 * may hold spaces and parentheses, so after the last ')'); 0 when unknown. */
static long st__parent_of(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* close_paren = strrchr(buf, ')');
  long ppid = 0;
  char state = 0;
  if (!close_paren || sscanf(close_paren + 1, " %c %ld", &state, &ppid) != 2) return 0;
  return ppid;
}

bool st_fs_lock_held_by_ancestor(long holder) {
  const char* e = getenv(ST__LOCK_PID_ENV);
  if (holder <= 1 || !e || strtol(e, NULL, 10) != holder) return false;
  /* A bounded walk: a process tree is never this deep. */
  long pid = (long)getppid();
  for (int i = 0; i < 64 && pid > 1; ++i, pid = st__parent_of(pid))
    if (pid == holder) return true;
  return false;
}

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR ""
#endif

const char* st_source_dir(void) {
  const char* env = getenv("STRATA_SOURCE_DIR");
  return env && env[0] ? env : STRATA_SOURCE_DIR;
}

char* st_python_path(void) {
  const char* env = getenv("STRATA_PYTHON");
  if (env && env[0]) return st_xstrdup(env);
  if (access(".venv/bin/python", X_OK) == 0) return st_xstrdup(".venv/bin/python");
  return st_path_join(st_source_dir(), ".venv/bin/python");
}

st_status st_fs_mkdirs(const char* path) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
    return st_status_make(ST_CODE_IO, "path too long: '%s'", path);
  for (char* p = buf + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return st_status_make(ST_CODE_IO, "cannot create folder '%s': %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0755) != 0 && errno != EEXIST)
    return st_status_make(ST_CODE_IO, "cannot create folder '%s': %s", buf, strerror(errno));
  if (!st_fs_is_dir(buf)) return st_status_make(ST_CODE_IO, "'%s' exists and is not a folder", buf);
  return ST_OK;
}

bool st_fs_exists(const char* path) {
  struct stat st;
  return stat(path, &st) == 0;
}

bool st_fs_is_dir(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

st_status st_fs_remove_tree(const char* path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? ST_OK : st_status_make(ST_CODE_IO, "cannot stat '%s': %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    DIR* d = opendir(path);
    if (!d) return st_status_make(ST_CODE_IO, "cannot open folder '%s': %s", path, strerror(errno));
    struct dirent* e;
    st_status s = ST_OK;
    while (!s && (e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char* child = st_path_join(path, e->d_name);
      s = st_fs_remove_tree(child);
      free(child);
    }
    closedir(d);
    if (s) return s;
    if (rmdir(path) != 0) return st_status_make(ST_CODE_IO, "cannot remove folder '%s': %s", path, strerror(errno));
    return ST_OK;
  }
  if (unlink(path) != 0) return st_status_make(ST_CODE_IO, "cannot remove '%s': %s", path, strerror(errno));
  return ST_OK;
}

char* st_path_join(const char* a, const char* b) {
  st_strbuf s = {0};
  st_strbuf_append(&s, a);
  if (s.len > 0 && s.data[s.len - 1] != '/') st_strbuf_append(&s, "/");
  st_strbuf_append(&s, b);
  return st_strbuf_take(&s);
}

char* st_cache_root(const char* configured) {
  st_strbuf s = {0};
  const char* env = getenv("STRATA_CACHE_DIR");
  const char* home = getenv("HOME");
  if (configured && configured[0]) {
    st_strbuf_append(&s, configured);
  } else if (env && env[0]) {
    st_strbuf_append(&s, env);
  } else if (home && home[0]) {
    st_strbuf_printf(&s, "%s/.cache/strata", home);
  } else {
    st_strbuf_append(&s, ".strata-cache");
  }
  return st_strbuf_take(&s);
}
