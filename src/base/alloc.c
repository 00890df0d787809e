/* alloc.c — the one out-of-memory policy of strata: allocation failure
 * aborts with a message (see include/strata/base.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
