/* kv_callbacks.c — the PJRT key-value callbacks of a client that spans the
 * processes of a job (docs/multiprocess.md, "One PJRT client across
 * processes"), served from the plain store of st_runtime_options.kv.
 *
 * The plugin calls these from threads of its own, with byte-string keys
 * and values, and expects failures as errors made by ITS callback_error
 * function (strata's st_status means nothing to it). So each adapter turns
 * the key into the NUL-terminated string strata's stores take, calls the
 * store, and maps the outcome to the error codes the plugin acts on: a get
 * whose wait ran out is DEADLINE_EXCEEDED (the plugin's own timeouts read
 * the same), a try-get of an absent key NOT_FOUND (the plugin polls with
 * it and treats NOT_FOUND as "not yet"), anything else INTERNAL carrying
 * strata's message. Nothing here may unwind or abort: a failure always
 * goes back through the plugin. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"
#include "strata/base.h"

/* The value deleter handed to the plugin: values come from the store's
 * allocator (st_runtime_kv.get's contract: free releases them); free
 * itself has another type. */
static void st__kv_value_free(char* value) { free(value); }

/* An error for the plugin. Without a callback_error (a plugin that breaks
 * the contract) no error can be made: the failure goes to stderr and the
 * call returns NULL, with the outputs left empty, so the plugin at least
 * reads nothing out of bounds. */
static pj_error* st__kv_fail(pj_callback_error_fn* callback_error, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pj_error* st__kv_fail(pj_callback_error_fn* callback_error, int code, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (callback_error && *callback_error) return (*callback_error)(code, msg, strlen(msg));
  fprintf(stderr, "strata: %s (the PJRT plugin gave no callback_error to report it with)\n", msg);
  return NULL;
}

/* The key as a NUL-terminated copy (*out, the caller frees), or an error:
 * strata's stores take C strings, so a key holding a NUL byte would name
 * another key there; it is refused rather than cut short. */
static pj_error* st__kv_key(pj_callback_error_fn* ce, const char* op, const char* key, size_t size, char** out) {
  *out = NULL;
  if (!key && size) return st__kv_fail(ce, PJ_CODE_INVALID_ARGUMENT, "strata key-value store: %s: NULL key of %zu bytes", op, size);
  const char* nul = size ? memchr(key, '\0', size) : NULL;
  if (nul)
    return st__kv_fail(ce, PJ_CODE_INVALID_ARGUMENT,
                       "strata key-value store: %s: the key (%zu bytes) holds a NUL byte at offset %zu; keys are "
                       "NUL-terminated strings",
                       op, size, (size_t)(nul - key));
  *out = st_xstrndup(size ? key : "", size);
  return NULL;
}

static bool st__kv_usable(const st_runtime_kv* kv) { return kv && kv->put && kv->get && kv->try_get; }

/* Fails the call with INTERNAL, the store's message and where it was. */
static pj_error* st__kv_store_failed(pj_callback_error_fn* ce, const st_runtime_kv* kv, const char* op, const char* key,
                                     st_status s) {
  pj_error* e = st__kv_fail(ce, PJ_CODE_INTERNAL, "strata key-value store: %s '%s' (node %d of %d): %s", op, key,
                            kv->node_id, kv->num_nodes, st_status_message(s));
  st_status_free(s);
  return e;
}

pj_error* st__pjrt_kv_get(pj_kv_get_args* a) {
  if (!a) return NULL; /* nothing to report through */
  a->value = NULL;
  a->value_size = 0;
  a->value_deleter = st__kv_value_free;
  const st_runtime_kv* kv = a->user;
  if (!st__kv_usable(kv))
    return st__kv_fail(a->callback_error, PJ_CODE_INTERNAL, "strata key-value store: get: the client has no store");
  if (a->timeout_in_ms < 0)
    return st__kv_fail(a->callback_error, PJ_CODE_INVALID_ARGUMENT, "strata key-value store: get: timeout of %d ms",
                       a->timeout_in_ms);
  char* key = NULL;
  pj_error* e = st__kv_key(a->callback_error, "get", a->key, a->key_size, &key);
  if (!key) return e;
  bool found = false;
  void* value = NULL;
  size_t size = 0;
  st_status s = kv->get(kv->user, key, a->timeout_in_ms, &found, &value, &size);
  if (s) {
    e = st__kv_store_failed(a->callback_error, kv, "get", key, s);
  } else if (!found) {
    e = st__kv_fail(a->callback_error, PJ_CODE_DEADLINE_EXCEEDED,
                    "strata key-value store: get '%s' (node %d of %d): no process put it within %d ms", key,
                    kv->node_id, kv->num_nodes, a->timeout_in_ms);
  } else {
    a->value = value;
    a->value_size = size;
    value = NULL;
  }
  free(value);
  free(key);
  return e;
}

pj_error* st__pjrt_kv_try_get(pj_kv_try_get_args* a) {
  if (!a) return NULL;
  a->value = NULL;
  a->value_size = 0;
  a->value_deleter = st__kv_value_free;
  const st_runtime_kv* kv = a->user;
  if (!st__kv_usable(kv))
    return st__kv_fail(a->callback_error, PJ_CODE_INTERNAL, "strata key-value store: try-get: the client has no store");
  char* key = NULL;
  pj_error* e = st__kv_key(a->callback_error, "try-get", a->key, a->key_size, &key);
  if (!key) return e;
  bool found = false;
  void* value = NULL;
  size_t size = 0;
  st_status s = kv->try_get(kv->user, key, &found, &value, &size);
  if (s) {
    e = st__kv_store_failed(a->callback_error, kv, "try-get", key, s);
  } else if (!found) {
    e = st__kv_fail(a->callback_error, PJ_CODE_NOT_FOUND, "strata key-value store: try-get '%s' (node %d of %d): not there",
                    key, kv->node_id, kv->num_nodes);
  } else {
    a->value = value;
    a->value_size = size;
    value = NULL;
  }
  free(value);
  free(key);
  return e;
}

pj_error* st__pjrt_kv_put(pj_kv_put_args* a) {
  if (!a) return NULL;
  const st_runtime_kv* kv = a->user;
  if (!st__kv_usable(kv))
    return st__kv_fail(a->callback_error, PJ_CODE_INTERNAL, "strata key-value store: put: the client has no store");
  if (!a->value && a->value_size)
    return st__kv_fail(a->callback_error, PJ_CODE_INVALID_ARGUMENT, "strata key-value store: put: NULL value of %zu bytes",
                       a->value_size);
  char* key = NULL;
  pj_error* e = st__kv_key(a->callback_error, "put", a->key, a->key_size, &key);
  if (!key) return e;
  st_status s = kv->put(kv->user, key, a->value_size ? a->value : "", a->value_size);
  if (s) e = st__kv_store_failed(a->callback_error, kv, "put", key, s);
  free(key);
  return e;
}
