/* fuzz_text.h — checks the fuzz targets share on the text strata writes
 * from untrusted input (reports, diffs): it stays well-formed UTF-8 with
 * no control characters but newline and tab, whatever the bytes read. */
#ifndef STRATA_FUZZ_TEXT_H
#define STRATA_FUZZ_TEXT_H

#include <stdbool.h>
#include <stddef.h>

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

#endif
