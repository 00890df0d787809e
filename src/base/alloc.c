/* alloc.c — the one out-of-memory policy of strata: allocation failure
 * aborts with a message (see include/strata/base.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif

#include "strata/base.h"

_Noreturn static void st__oom(size_t n) {
  /* No allocation here: stderr is unbuffered and fprintf of a number does
   * not allocate. */
  fprintf(stderr, "strata: out of memory allocating %zu bytes\n", n);
  abort();
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

void st_oom(const char* what) {
  fprintf(stderr, "strata: out of memory (%s)\n", what ? what : "");
  abort();
}

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
