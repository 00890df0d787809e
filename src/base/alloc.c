/* alloc.c — the one out-of-memory policy of strata: allocation failure
 * aborts with a message, or, while an st_oom_hook is installed, runs the
 * hook and exits 4 (see include/strata/base.h). */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif

#include "strata/base.h"

/* The hook: one pointer (malloc's failure is the process's). The state
 * serialises installing, removing and running it: 0 idle, 1 an install or
 * remove in progress, 2 the hook running (the process is about to exit). */
static _Atomic(st_oom_hook*) g_oom_hook;
static atomic_int g_oom_state;
static _Thread_local bool t_in_oom_hook;

/* Takes the state for |as|; false when the hook is already running. */
static bool st__oom_take(int as) {
  for (;;) {
    int idle = 0;
    if (atomic_compare_exchange_weak(&g_oom_state, &idle, as)) return true;
    if (idle == 2) return false;
    sched_yield();
  }
}

/* Another thread's hook is running and will end the process. */
_Noreturn static void st__oom_wait(void) {
  for (;;) pause();
}

_Noreturn static void st__oom_report(size_t n, const char* what) {
  if (!t_in_oom_hook && atomic_load(&g_oom_hook)) {
    if (!st__oom_take(2)) st__oom_wait();
    /* Loaded again under the state: a hook removed meanwhile is gone. */
    st_oom_hook* h = atomic_load(&g_oom_hook);
    if (h) {
      t_in_oom_hook = true;
      free(h->reserve);
      h->reserve = NULL;
      h->fn(h->ctx, n, what ? what : "");
      _exit(st_code_exit_code(ST_CODE_MEMORY));
    }
  }
  /* No allocation here: stderr is unbuffered and fprintf of a number does
   * not allocate. */
  if (what && what[0]) fprintf(stderr, "strata: out of memory (%s)\n", what);
  else fprintf(stderr, "strata: out of memory allocating %zu bytes\n", n);
  abort();
}

_Noreturn static void st__oom(size_t n) { st__oom_report(n, NULL); }

void st_oom_hook_install(st_oom_hook* hook, st_oom_fn fn, void* ctx) {
  memset(hook, 0, sizeof(*hook));
  hook->fn = fn;
  hook->ctx = ctx;
  hook->reserve = st_xmalloc(ST_OOM_RESERVE_BYTES);
  /* Touched, so that it is memory the kernel really gave, not a promise. */
  memset(hook->reserve, 0, ST_OOM_RESERVE_BYTES);
  if (!st__oom_take(1)) st__oom_wait();
  hook->previous = atomic_load(&g_oom_hook);
  atomic_store(&g_oom_hook, hook);
  hook->installed = true;
  atomic_store(&g_oom_state, 0);
}

void st_oom_hook_remove(st_oom_hook* hook) {
  if (!hook->installed) return;
  if (!st__oom_take(1)) st__oom_wait();
  atomic_store(&g_oom_hook, hook->previous);
  hook->installed = false;
  atomic_store(&g_oom_state, 0);
  free(hook->reserve);
  hook->reserve = NULL;
}

void* st_xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) st__oom(n);
  return p;
}

void* st_xcalloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) st__oom(SIZE_MAX);
  void* p = calloc(count ? count : 1, size ? size : 1);
  if (!p) st__oom(count * size);
  return p;
}

void* st_xrealloc(void* p, size_t n) {
  void* q = realloc(p, n ? n : 1);
  if (!q) st__oom(n);
  return q;
}

char* st_xstrndup(const char* s, size_t n) {
  char* p = st_xmalloc(n + 1);
  if (n) memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char* st_xstrdup(const char* s) { return s ? st_xstrndup(s, strlen(s)) : st_xstrndup("", 0); }

void st_oom(const char* what) { st__oom_report(0, what && what[0] ? what : "unknown allocation"); }

/* The process's memory as the kernel and glibc's malloc see it (issue 18's
 * `memory` events). /proc/self/status is Linux's; mallinfo2 is glibc's
 * (2.33+) and sums every arena. */
int64_t st_mem_rss(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  int n = fscanf(f, "%lld %lld", &size, &resident);
  fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? (int64_t)resident * page : 0;
}

void st_mem_usage_read(st_mem_usage* out) {
  memset(out, 0, sizeof(*out));
  FILE* f = fopen("/proc/self/status", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof(line), f)) {
      long long kb = 0;
      if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) out->rss = kb * 1024;
      else if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) out->hwm = kb * 1024;
      else if (sscanf(line, "RssAnon: %lld kB", &kb) == 1) out->rss_anon = kb * 1024;
      else if (sscanf(line, "RssFile: %lld kB", &kb) == 1) out->rss_file = kb * 1024;
    }
    fclose(f);
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  out->malloc_known = true;
  out->heap_bytes = (int64_t)mi.arena;
  out->mmap_bytes = (int64_t)mi.hblkhd;
  out->in_use_bytes = (int64_t)mi.uordblks + (int64_t)mi.hblkhd;
  out->free_held_bytes = (int64_t)mi.fordblks;
#endif
}

/* A cgroup v2 memory file of this process's cgroup ("max" or absent: -1). */
static int64_t st__cgroup_value(const char* cgroup, const char* file) {
  char path[1024];
  snprintf(path, sizeof(path), "/sys/fs/cgroup%s/%s", cgroup, file);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1; /* "max" */
  fclose(f);
  return (int64_t)v;
}

void st_host_memory_read(st_host_memory* out) {
  memset(out, 0, sizeof(*out));
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return;
  char line[256];
  bool total = false, avail = false;
  while (fgets(line, sizeof(line), f)) {
    long long kb = 0;
    if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) {
      out->total_bytes = (int64_t)kb * 1024;
      total = true;
    } else if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
      out->available_bytes = (int64_t)kb * 1024;
      avail = true;
    }
  }
  fclose(f);
  out->known = total && avail;
  out->meminfo_available_bytes = out->available_bytes;
  if (!out->known) return;
  /* A container's limit is its cgroup's, which /proc/meminfo does not
   * show. cgroup v2 only: the unified line "0::/path" of /proc/self/cgroup. */
  f = fopen("/proc/self/cgroup", "r");
  if (!f) return;
  char cg[768] = "";
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, "0::", 3)) {
      snprintf(cg, sizeof(cg), "%s", line + 3);
      cg[strcspn(cg, "\n")] = '\0';
      if (!strcmp(cg, "/")) cg[0] = '\0';
      break;
    }
  fclose(f);
  int64_t max = st__cgroup_value(cg, "memory.max");
  if (max <= 0) return;
  int64_t current = st__cgroup_value(cg, "memory.current");
  int64_t left = current >= 0 && current < max ? max - current : 0;
  if (max < out->total_bytes) {
    out->total_bytes = max;
    out->cgroup_limited = true;
  }
  if (left < out->available_bytes) {
    out->available_bytes = left;
    out->cgroup_limited = true;
  }
}
