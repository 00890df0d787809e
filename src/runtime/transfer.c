/* transfer.c — st_event (a PJRT_Event plus context for its error) and
 * st_buffer (a PJRT_Buffer plus strata's view of its type and state):
 * host<->device copies and readiness. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"

/*===-------------------------------------------------------------------===*/
/* Events                                                                   */
/*===-------------------------------------------------------------------===*/

/* Wraps |handle| (ownership moves to the event; NULL makes a completed
 * event). On failure the handle is destroyed. */
static st_status st__event_wrap(const pj_api* api, pj_event* handle, char* context_owned, st_event** out) {
  *out = NULL;
  st_event* ev = st_xcalloc(1, sizeof(*ev));
  ev->api = api;
  ev->handle = handle;
  ev->context = context_owned;
  *out = ev;
  return ST_OK;
}

st_status st__event_make(const pj_api* api, pj_event* handle, char* context_owned, st_event** out) {
  return st__event_wrap(api, handle, context_owned, out);
}

st_status st_event_await(st_event* ev) {
  assert(ev); /* a caller's bug, not bad input */
  if (!ev->handle) return ST_OK;
  pj_event_args a = {.struct_size = sizeof(a), .event = ev->handle};
  return st__pj_status(ev->api, ev->api->event_await(&a), "%s", ev->context ? ev->context : "event");
}

bool st_event_is_ready(st_event* ev) {
  if (!ev || !ev->handle) return true;
  pj_event_ready_args a = {.struct_size = sizeof(a), .event = ev->handle};
  pj_error* e = ev->api->event_is_ready(&a);
  if (e) {
    /* Cannot ask: report ready so pollers move on to await, which reports. */
    st__pj_error_free(ev->api, e);
    return true;
  }
  return a.is_ready;
}

typedef struct {
  const pj_api* api;
  st_event_fn fn;
  void* user;
  char* context;
} st__ready_ctx;

/* Runs on a plugin thread (or inline): converts the plugin's error, which
 * this callback owns, and hands the status to the user's function. */
static void st__on_ready_trampoline(pj_error* error, void* user) {
  st__ready_ctx* c = user;
  st_status s = st__pj_status(c->api, error, "%s", c->context ? c->context : "event");
  c->fn(s, c->user);
  free(c->context);
  free(c);
}

st_status st_event_on_ready(st_event* ev, st_event_fn fn, void* user) {
  assert(ev && fn); /* a caller's bug, not bad input */
  if (!ev->handle) { /* already complete: call at once, as PJRT would */
    fn(ST_OK, user);
    return ST_OK;
  }
  st__ready_ctx* c = st_xcalloc(1, sizeof(*c));
  c->api = ev->api;
  c->fn = fn;
  c->user = user;
  c->context = st_xstrdup(ev->context ? ev->context : "event");
  pj_event_on_ready_args a = {.struct_size = sizeof(a), .event = ev->handle, .callback = st__on_ready_trampoline, .user = c};
  pj_error* e = ev->api->event_on_ready(&a);
  if (e) {
    /* Not registered: the callback will never run, so free its context. */
    free(c->context);
    free(c);
    return st__pj_status(ev->api, e, "%s: registering a completion callback", ev->context ? ev->context : "event");
  }
  return ST_OK;
}

void st_event_destroy(st_event* ev) {
  if (!ev) return;
  st__pj_event_free(ev->api, ev->handle);
  free(ev->context);
  free(ev);
}

/*===-------------------------------------------------------------------===*/
/* Buffers                                                                  */
/*===-------------------------------------------------------------------===*/

static st_status st__check_type(const st_tensor_type* t) {
  if (!t) return st_status_make(ST_CODE_INTERNAL, "tensor type is NULL");
  if (st_dtype_size(t->dtype) == 0) return st_status_make(ST_CODE_RUNTIME, "invalid dtype %d", (int)t->dtype);
  if (t->rank < 0 || t->rank > ST_MAX_RANK)
    return st_status_make(ST_CODE_RUNTIME, "rank %d is out of range (0..%d)", t->rank, ST_MAX_RANK);
  for (int i = 0; i < t->rank; ++i)
    if (t->dims[i] < 0) return st_status_make(ST_CODE_RUNTIME, "dimension %d is negative (%lld)", i, (long long)t->dims[i]);
  return ST_OK;
}

st_status st__buffer_wrap(st_runtime* rt, pj_buffer* handle, int device, const st_tensor_type* type, st_buffer** out) {
  *out = NULL;
  st_buffer* b = st_xcalloc(1, sizeof(*b));
  b->rt = rt;
  b->handle = handle;
  b->type = *type;
  b->device = device;
  b->memory = -1;
  atomic_fetch_add(&rt->n_live_buffers, 1);
  *out = b;
  return ST_OK;
}

st_status st_buffer_from_host(st_runtime* rt, int device, const st_tensor_type* type, const void* data,
                              st_buffer** out_buffer) {
  assert(out_buffer); /* a caller's bug, not bad input */
  *out_buffer = NULL;
  assert(rt); /* a caller's bug, not bad input */
  ST_RETURN_IF_ERROR(st__check_type(type), "host->device copy");
  char tbuf[128];
  st_tensor_type_format(type, tbuf, sizeof(tbuf));
  if (device < 0 || device >= rt->device_count)
    return st_status_make(ST_CODE_RUNTIME, "host->device copy of %s: device %d does not exist (%d devices)", tbuf, device,
                          rt->device_count);
  size_t bytes = st_tensor_type_bytes(type);
  static const uint64_t kEmpty = 0; /* a valid pointer for zero-byte tensors */
  assert(data || !bytes); /* a caller's bug, not bad input */
  pj_from_host_args a = {.struct_size = sizeof(a)};
  a.client = rt->client;
  a.data = data ? data : (const void*)&kEmpty;
  a.type = st__dtype_to_pj(type->dtype);
  a.dims = type->dims;
  a.num_dims = (size_t)type->rank;
  /* The plugin copies |data| before returning, so callers may reuse it. */
  a.semantics = PJ_HOST_IMMUTABLE_ONLY_DURING_CALL;
  a.device = rt->devices[device].handle;
  pj_error* e = rt->api->client_buffer_from_host(&a);
  ST_RETURN(st__pj_status(rt->api, e, "host->device copy of %s to device %d", tbuf, device));
  /* With copy-during-call semantics the host data is already released; the
   * event carries no information strata needs. */
  st__pj_event_free(rt->api, a.done_with_host_buffer);
  st_status s = st__buffer_wrap(rt, a.buffer, device, type, out_buffer);
  if (!s) atomic_fetch_add(&rt->n_h2d_bytes, (int64_t)bytes);
  return s;
}

static st_status st__consumed_error(const st_buffer* b, const char* what) {
  char tbuf[128];
  return st_status_make(ST_CODE_RUNTIME,
                        "%s: buffer %s on device %d was consumed (donated to program '%s'); it holds no data", what,
                        st_tensor_type_format(&b->type, tbuf, sizeof(tbuf)), b->device, b->consumed_by);
}

st_status st_buffer_to_host_async(st_buffer* b, void* dst, size_t dst_size, st_event** out_event) {
  assert(out_event); /* a caller's bug, not bad input */
  *out_event = NULL;
  assert(b); /* a caller's bug, not bad input */
  if (b->consumed) return st__consumed_error(b, "device->host copy");
  char tbuf[128];
  st_tensor_type_format(&b->type, tbuf, sizeof(tbuf));
  size_t bytes = st_tensor_type_bytes(&b->type);
  if (dst_size != bytes)
    return st_status_make(ST_CODE_RUNTIME, "device->host copy of %s: destination has %zu bytes, the buffer %zu", tbuf,
                          dst_size, bytes);
  assert(dst || !bytes); /* a caller's bug, not bad input */
  if (bytes == 0) return st__event_wrap(b->rt->api, NULL, st__sprintf("device->host copy of %s", tbuf), out_event);
  pj_to_host_args a = {.struct_size = sizeof(a), .src = b->handle, .dst = dst, .dst_size = dst_size};
  pj_error* e = b->rt->api->buffer_to_host(&a);
  ST_RETURN(st__pj_status(b->rt->api, e, "device->host copy of %s from device %d", tbuf, b->device));
  atomic_fetch_add(&b->rt->n_d2h_bytes, (int64_t)bytes);
  return st__event_wrap(b->rt->api, a.event, st__sprintf("device->host copy of %s from device %d", tbuf, b->device),
                        out_event);
}

st_status st_buffer_to_host(st_buffer* b, void* dst, size_t dst_size) {
  st_event* ev = NULL;
  ST_RETURN(st_buffer_to_host_async(b, dst, dst_size, &ev));
  st_status s = st_event_await(ev);
  st_event_destroy(ev);
  return s;
}

const st_tensor_type* st_buffer_type(const st_buffer* b) { return b ? &b->type : NULL; }
size_t st_buffer_bytes(const st_buffer* b) { return b ? st_tensor_type_bytes(&b->type) : 0; }
int st_buffer_device(const st_buffer* b) { return b ? b->device : -1; }
bool st_buffer_is_consumed(const st_buffer* b) { return b && b->consumed; }

st_status st_buffer_ready_event(st_buffer* b, st_event** out_event) {
  assert(out_event); /* a caller's bug, not bad input */
  *out_event = NULL;
  assert(b); /* a caller's bug, not bad input */
  if (b->consumed) return st__consumed_error(b, "ready event");
  char tbuf[128];
  st_tensor_type_format(&b->type, tbuf, sizeof(tbuf));
  pj_buffer_event_args a = {.struct_size = sizeof(a), .buffer = b->handle};
  ST_RETURN(st__pj_status(b->rt->api, b->rt->api->buffer_ready_event(&a), "ready event of buffer %s", tbuf));
  return st__event_wrap(b->rt->api, a.event, st__sprintf("buffer %s on device %d", tbuf, b->device), out_event);
}

void st_buffer_destroy(st_buffer* b) {
  if (!b) return;
  if (b->handle) {
    pj_buffer_args a = {.struct_size = sizeof(a), .buffer = b->handle};
    st__pj_error_free(b->rt->api, b->rt->api->buffer_destroy(&a));
  }
  atomic_fetch_sub(&b->rt->n_live_buffers, 1);
  free(b);
}

/*===-------------------------------------------------------------------===*/
/* Memory spaces                                                            */
/*===-------------------------------------------------------------------===*/

static int st__memory_find(const st__device* d, const char* kind) {
  for (int j = 0; j < d->memory_count; ++j)
    if (d->memories[j] && !strcmp(d->memory_kinds[j], kind)) return j;
  return -1;
}

/* The slot is an optional, later addition to the table (see pjrt_abi.h). */
static bool st__api_has_copy_to_memory(const pj_api* api) {
  return api->struct_size >= PJ_SIZE(pj_api, buffer_copy_to_memory) && api->buffer_copy_to_memory != NULL;
}

bool st_runtime_can_copy_to_memory(const st_runtime* rt, int device, const char* kind) {
  if (!rt || !kind || device < 0 || device >= rt->device_count) return false;
  return st__api_has_copy_to_memory(rt->api) && st__memory_find(&rt->devices[device], kind) >= 0;
}

const char* st_buffer_memory_kind(const st_buffer* b) {
  if (!b) return "";
  const st__device* d = &b->rt->devices[b->device];
  int j = b->memory >= 0 ? b->memory : d->default_memory;
  return j < d->memory_count ? d->memory_kinds[j] : "";
}

st_status st_buffer_copy_to_memory(st_buffer* b, const char* kind, st_buffer** out_buffer) {
  assert(out_buffer); /* a caller's bug, not bad input */
  *out_buffer = NULL;
  assert(b && kind); /* a caller's bug, not bad input */
  if (b->consumed) return st__consumed_error(b, "memory-space copy");
  st_runtime* rt = b->rt;
  char tbuf[128];
  st_tensor_type_format(&b->type, tbuf, sizeof(tbuf));
  const st__device* d = &rt->devices[b->device];
  int j = st__memory_find(d, kind);
  if (j < 0)
    return st_status_make(ST_CODE_RUNTIME, "copy of %s to memory '%s': device %d has no such memory space", tbuf, kind,
                          b->device);
  if (!st__api_has_copy_to_memory(rt->api))
    return st_status_make(ST_CODE_RUNTIME, "copy of %s to memory '%s': the plugin lacks PJRT_Buffer_CopyToMemory", tbuf,
                          kind);
  pj_copy_to_memory_args a = {.struct_size = sizeof(a), .buffer = b->handle, .dst_memory = d->memories[j]};
  ST_RETURN(st__pj_status(rt->api, rt->api->buffer_copy_to_memory(&a), "copy of %s on device %d from memory '%s' to '%s'",
                          tbuf, b->device, st_buffer_memory_kind(b), kind));
  st_status s = st__buffer_wrap(rt, a.dst_buffer, b->device, &b->type, out_buffer);
  if (s) return s;
  (*out_buffer)->memory = j;
  /* Leaving the default memory is a device->host move; entering it, host->device. */
  int64_t bytes = (int64_t)st_tensor_type_bytes(&b->type);
  if (j == d->default_memory)
    atomic_fetch_add(&rt->n_h2d_bytes, bytes);
  else
    atomic_fetch_add(&rt->n_d2h_bytes, bytes);
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Device to device                                                         */
/*===-------------------------------------------------------------------===*/

/* Also optional: a plugin may leave the slot NULL. */
static bool st__api_has_copy_to_device(const pj_api* api) {
  return api->struct_size >= PJ_SIZE(pj_api, buffer_copy_to_device) && api->buffer_copy_to_device != NULL;
}

st_status st_buffer_copy_to_device(st_buffer* b, int device, st_buffer** out_buffer) {
  assert(out_buffer); /* a caller's bug, not bad input */
  *out_buffer = NULL;
  assert(b); /* a caller's bug, not bad input */
  if (b->consumed) return st__consumed_error(b, "device->device copy");
  st_runtime* rt = b->rt;
  char tbuf[128];
  st_tensor_type_format(&b->type, tbuf, sizeof(tbuf));
  if (device < 0 || device >= rt->device_count)
    return st_status_make(ST_CODE_RUNTIME, "device->device copy of %s from device %d: device %d does not exist (%d devices)",
                          tbuf, b->device, device, rt->device_count);
  if (device == b->device)
    return st_status_make(ST_CODE_RUNTIME, "device->device copy of %s: the buffer is already on device %d", tbuf, device);
  /* The copy lands in the destination's default memory; a buffer parked
   * in a host memory space comes back to its own device first. */
  if (b->memory >= 0 && b->memory != rt->devices[b->device].default_memory)
    return st_status_make(ST_CODE_RUNTIME,
                          "device->device copy of %s from device %d: the buffer is in memory '%s', not the device's "
                          "default memory",
                          tbuf, b->device, st_buffer_memory_kind(b));
  if (!st__api_has_copy_to_device(rt->api))
    return st_status_make(ST_CODE_RUNTIME,
                          "device->device copy of %s from device %d to %d: the plugin lacks PJRT_Buffer_CopyToDevice", tbuf,
                          b->device, device);
  pj_copy_to_device_args a = {.struct_size = sizeof(a), .buffer = b->handle, .dst_device = rt->devices[device].handle};
  ST_RETURN(st__pj_status(rt->api, rt->api->buffer_copy_to_device(&a), "device->device copy of %s from device %d to %d", tbuf,
                          b->device, device));
  return st__buffer_wrap(rt, a.dst_buffer, device, &b->type, out_buffer);
}
