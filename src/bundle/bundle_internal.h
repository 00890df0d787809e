/*
 * bundle/bundle_internal.h — what the files of src/bundle/ share: the
 * manifest reader's pieces the cache (cache.c) uses. Not for other modules:
 * they use strata/bundle.h.
 */
#ifndef STRATA_BUNDLE_INTERNAL_H
#define STRATA_BUNDLE_INTERNAL_H

#include <stdint.h>

#include "strata/bundle.h"
#include "strata/status.h"

/* Instantiates |bundle|'s parameter and layer tables for |n_layers| layers
 * (manifest.c). The bundle's programs are the same for every depth; only
 * these tables and model.n_layers are not. */
st_status st__bundle_set_depth(st_bundle* bundle, int64_t n_layers);
/* <dir>/manifest.json parsed without its program files (NULL when it does
 * not parse): the tensors a bundle promised, which the lint compares a
 * re-export with (manifest.c). Caller destroys. */
st_bundle* st__bundle_manifest_of(const char* dir);

#endif /* STRATA_BUNDLE_INTERNAL_H */
