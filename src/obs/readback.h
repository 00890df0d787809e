/* readback.h — reading a run directory's files back as untrusted input
 * (strata report, strata diff, strata note): every read is bounded in
 * size. Private to obs. */
#ifndef STRATA_OBS_READBACK_H
#define STRATA_OBS_READBACK_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/base.h"

/* Up to |max| bytes of regular file |path| (NUL-terminated, owned by the
 * caller). *out_cut: the file was longer. False when absent, unreadable or
 * not a regular file (a folder, a FIFO: never blocks). */
bool st_readback_bounded(const char* path, size_t max, char** out, size_t* out_size, bool* out_cut);

/* Regular file |path| parsed as one JSON object of at most |max| bytes.
 * Missing: ST_OK and *out_json NULL. Larger than |max|, not JSON or not an
 * object: ST_CODE_CONFIG naming |path| and what is wrong. */
st_status st_readback_json_object(const char* path, size_t max, st_json** out_json /* owned by caller */);

#endif
