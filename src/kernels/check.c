/*
 * check.c — the handlers against the contract (a build defect if they
 * differ) and a bundle's kernels against the handlers (a runtime error,
 * exit 4, before any compile: the plugin would otherwise fail the compile
 * with "No FFI handler registered", or, for a handler of another contract
 * version, run code the programs were not exported for).
 */
#include <string.h>
#include <jansson.h>

#include "kernels/internal.h"
#include "strata/base.h"
#include "strata/kernels.h"

const st_kernel_handler* st_kernels_handlers(int* count) {
  if (count) *count = st__kernel_handler_count;
  return st__kernel_handlers;
}

bool st_kernels_bundle_uses_ffi(const st_bundle* b) {
  for (int i = 0; b && i < b->kernel_count; ++i)
    if (!strcmp(b->kernels[i].impl, "ffi")) return true;
  return false;
}

json_t* st_kernels_bundle_json(const st_bundle* b) {
  json_t* j = st_json_obj();
  for (int i = 0; b && i < b->kernel_count; ++i) st_json_put_str(j, b->kernels[i].name, b->kernels[i].impl);
  st_json_put_str(j, "isa", st_kernels_isa_name(st_kernels_isa()));
  return j;
}

static const st_kernel_handler* st__handler(const char* op, const char* direction) {
  for (int i = 0; i < st__kernel_handler_count; ++i)
    if (!strcmp(st__kernel_handlers[i].op, op) && !strcmp(st__kernel_handlers[i].direction, direction))
      return &st__kernel_handlers[i];
  return NULL;
}

static const st_kernel_handler* st__by_target(const char* target) {
  for (int i = 0; i < st__kernel_handler_count; ++i)
    if (!strcmp(st__kernel_handlers[i].target, target)) return &st__kernel_handlers[i];
  return NULL;
}

static bool st__has_impl(const st_kernel_op* o, const char* impl) {
  for (int k = 0; k < o->impl_count; ++k)
    if (!strcmp(o->impls[k], impl)) return true;
  return false;
}

st_status st_kernels_check_contract(const st_kernel_contract* c) {
  for (int i = 0; i < c->op_count; ++i) {
    const st_kernel_op* o = &c->ops[i];
    if (!st__has_impl(o, "ffi")) continue;
    /* fwd, bwd (with a backward), then an optional operand's form's targets */
    for (int d = 0; d < o->target_count; ++d) {
      const char* dir = o->target_dir[d];
      if (!strcmp(dir, "bwd") && !o->has_backward) continue;
      const st_kernel_handler* h = st__handler(o->name, dir);
      if (!h)
        return st_status_make(ST_CODE_INTERNAL, "kernel '%s' (contract v%d) lists ffi but strata has no %s handler",
                              o->name, o->version, dir);
      if (h->version != o->version || strcmp(h->target, o->targets[d]))
        return st_status_make(ST_CODE_INTERNAL,
                              "kernel '%s': the contract says version %d, %s target '%s'; the compiled handler is "
                              "version %d, target '%s' (src/kernels/handlers.c and kernel_contract.json disagree)",
                              o->name, o->version, dir, o->targets[d], h->version, h->target);
    }
    if (!st__handler(o->name, "fwd"))
      return st_status_make(ST_CODE_INTERNAL, "kernel '%s' (contract v%d) lists ffi but strata has no fwd handler",
                            o->name, o->version);
  }
  for (int i = 0; i < st__kernel_handler_count; ++i) {
    const st_kernel_handler* h = &st__kernel_handlers[i];
    const st_kernel_op* o = st_kernel_contract_find(c, h->op);
    if (!o)
      return st_status_make(ST_CODE_INTERNAL, "handler '%s' serves op '%s', which the contract does not have",
                            h->target, h->op);
    bool listed = false;
    for (int d = 0; d < o->target_count; ++d) listed = listed || !strcmp(o->targets[d], h->target);
    if (!listed)
      return st_status_make(ST_CODE_INTERNAL, "handler '%s' (%s %s) is not among the contract's ffi_targets of '%s'",
                            h->target, h->op, h->direction, h->op);
  }
  return ST_OK;
}

st_status st_kernels_check_bundle(const st_bundle* b) {
  for (int i = 0; b && i < b->kernel_count; ++i) {
    const st_bundle_kernel* k = &b->kernels[i];
    if (strcmp(k->impl, "ffi")) continue;
    const st_kernel_handler* fwd = st__handler(k->name, "fwd");
    if (!fwd)
      return st_status_make(ST_CODE_RUNTIME,
                            "bundle %s: kernel '%s' (ffi, contract version %d) has no handler registered by this "
                            "strata (registered version: none). To fix: set kernels.%s=xla, or use the strata that "
                            "exported this bundle",
                            b->dir, k->name, k->version, k->name);
    if (fwd->version != k->version)
      return st_status_make(ST_CODE_RUNTIME,
                            "bundle %s: kernel '%s' was exported against contract version %d, the handler this strata "
                            "registers is version %d. To fix: re-export the bundle (delete it, or drop bundle.dir) "
                            "with this strata's front-end, or set kernels.%s=xla",
                            b->dir, k->name, k->version, fwd->version, k->name);
    for (int t = 0; t < k->target_count; ++t) {
      const st_kernel_handler* h = st__by_target(k->targets[t]);
      if (!h || strcmp(h->op, k->name))
        return st_status_make(ST_CODE_RUNTIME,
                              "bundle %s: kernel '%s' (contract version %d) calls FFI target '%s', which this strata "
                              "does not register (its '%s' handlers are version %d: %s, %s)",
                              b->dir, k->name, k->version, k->targets[t], k->name, fwd->version, fwd->target,
                              st__handler(k->name, "bwd") ? st__handler(k->name, "bwd")->target : "-");
    }
  }
  return ST_OK;
}
