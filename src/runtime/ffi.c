/*
 * ffi.c — registering C kernels (XLA FFI handlers) with the plugin through
 * its PJRT FFI extension (docs/kernels.md, "Registration").
 *
 * Why through the plugin: the plugin carries its own copy of XLA and so its
 * own handler registry; a handler registered anywhere else (jaxlib's
 * registry, a static initializer of another library) is invisible to it.
 * Why before the client: registration must precede every compile that names
 * a target, and doing it first makes that structural.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"

/* XLA matches the platform name case-insensitively against its canonical
 * names; "Host" is the CPU platform's. A plugin-specific name (JAX's
 * "strata_plugin") registers without error but is never found at run time. */
static const char kPlatform[] = "Host";

static const pj_ffi_ext* st__find_ffi_extension(const pj_api* api) {
  /* The chain is the plugin's; bound the walk so a corrupt or cyclic chain
   * cannot hang the process. */
  int n = 0;
  for (const pj_ext* e = api->ext; e && n < 64; e = e->next, ++n)
    if (e->type == PJ_EXT_TYPE_FFI && e->struct_size >= PJ_SIZE(pj_ffi_ext, register_handler))
      return (const pj_ffi_ext*)e;
  return NULL;
}

st_status st__register_ffi_targets(st_runtime* rt, const st_runtime_options* o) {
  if (o->ffi_target_count <= 0) return ST_OK;
  if (o->ffi_target_count > 4096 || !o->ffi_targets)
    return st_status_make(ST_CODE_INTERNAL, "st_runtime_create: bad FFI target list (%d)", o->ffi_target_count);
  const pj_ffi_ext* ffi = st__find_ffi_extension(rt->api);
  if (!ffi || !ffi->register_handler)
    return st_status_make(ST_CODE_RUNTIME,
                          "plugin %s has no PJRT FFI extension, so strata's C kernels (%d FFI target%s, first '%s') "
                          "cannot be registered. To fix: set kernels.<op>=xla (docs/kernels.md) or use a plugin "
                          "with the FFI extension",
                          rt->plugin_path, o->ffi_target_count, o->ffi_target_count == 1 ? "" : "s",
                          o->ffi_targets[0].name ? o->ffi_targets[0].name : "?");
  rt->ffi_targets = st_xcalloc((size_t)o->ffi_target_count, sizeof(char*));
  for (int i = 0; i < o->ffi_target_count; ++i) {
    const st_ffi_target* t = &o->ffi_targets[i];
    if (!t->name || !t->name[0] || !t->handler)
      return st_status_make(ST_CODE_INTERNAL, "st_runtime_create: FFI target %d has no name or handler", i);
    pj_ffi_register_args a;
    memset(&a, 0, sizeof(a));
    a.struct_size = PJ_SIZE(pj_ffi_register_args, traits);
    a.target_name = t->name;
    a.target_name_size = strlen(t->name);
    a.handler = t->handler;
    a.platform_name = kPlatform;
    a.platform_name_size = sizeof(kPlatform) - 1;
    /* The extension returns NULL even when XLA's registry refused the
     * handler (a name taken by another handler, a bad metadata answer):
     * only a compile that calls the target proves it is there. What it does
     * return (a struct size it does not accept) is an error. */
    st_status s = st__pj_status(rt->api, ffi->register_handler(&a), "registering FFI target '%s' with plugin %s",
                                t->name, rt->plugin_path);
    if (s) return s;
    rt->ffi_targets[rt->ffi_target_count++] = st_xstrdup(t->name);
  }
  return ST_OK;
}

int st_runtime_ffi_target_count(const st_runtime* rt) { return rt ? rt->ffi_target_count : 0; }

const char* st_runtime_ffi_target_name(const st_runtime* rt, int i) {
  if (!rt || i < 0 || i >= rt->ffi_target_count) return NULL;
  return rt->ffi_targets[i];
}
