/* fuzz_util.h — what the fuzz targets that read files share: writing an
 * input into a scratch directory, and the check on the text strata writes
 * from untrusted input (reports, diffs): well-formed UTF-8 with no control
 * characters but newline and tab, whatever the bytes read. */
#ifndef STRATA_FUZZ_UTIL_H
#define STRATA_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes <dir>/<name> with |n| bytes of |p|; a NULL |p| removes the file.
 * The fuzzer's own scratch files: a failure is the harness's, abort. */
static inline void fuzz_put_file(const char* dir, const char* name, const void* p, size_t n) {
  char path[256];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  if (!p) {
    unlink(path);
    return;
  }
  FILE* f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n)) abort();
  fclose(f);
}

static inline bool fuzz_valid_utf8(const unsigned char* s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c < 0x80) {
      if (c < 0x20 && c != '\n' && c != '\t') return false;
      ++i;
      continue;
    }
    size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (!k || i + k > n) return false;
    for (size_t j = 1; j < k; ++j)
      if ((s[i + j] & 0xc0) != 0x80) return false;
    i += k;
  }
  return true;
}

#endif /* STRATA_FUZZ_UTIL_H */
