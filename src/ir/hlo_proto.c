/* hlo_proto.c — what XLA made of a program: fusions and instruction
 * counts read from the optimized HloModuleProto that PJRT returns
 * (runtime.keep_optimized_hlo; docs/analysis.md "What XLA did").
 *
 * A protobuf wire-format walk, not a generated reader: strata compiles no
 * copy of XLA's hlo.proto. The field numbers it relies on (xla/service/
 * hlo.proto, checked against the CPU plugin's output):
 *   HloModuleProtoWithConfig  hlo_module = 1
 *   HloModuleProto            entry_computation_name = 2, computations = 3
 *   HloComputationProto       name = 1, instructions = 2, id = 5
 *   HloInstructionProto       name = 1, opcode = 2, fusion_kind = 11,
 *                             called_computation_ids = 38 (packed or not)
 * Every length is checked against the bytes left; nesting is three levels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/ir.h"

#define ST__HLO_MAX_COMPUTATIONS 1000000

typedef struct st__pb {
  const uint8_t* p;
  const uint8_t* e;
  bool bad;
} st__pb;

static uint64_t st__varint(st__pb* b) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (b->p >= b->e) break;
    uint8_t c = *b->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return v;
  }
  b->bad = true;
  return 0;
}

/* The next field: its number and wire type; for type 2 [*out_b, *out_e)
 * the payload, for type 0 *out_v the value. False at the end or on bad
 * bytes (b->bad). */
static bool st__field(st__pb* b, uint32_t* num, int* type, const uint8_t** out_b, const uint8_t** out_e,
                      uint64_t* out_v) {
  if (b->bad || b->p >= b->e) return false;
  uint64_t key = st__varint(b);
  *num = (uint32_t)(key >> 3);
  *type = (int)(key & 7);
  *out_b = *out_e = NULL;
  *out_v = 0;
  switch (*type) {
    case 0:
      *out_v = st__varint(b);
      break;
    case 1:
      if (b->e - b->p < 8) b->bad = true;
      else b->p += 8;
      break;
    case 5:
      if (b->e - b->p < 4) b->bad = true;
      else b->p += 4;
      break;
    case 2: {
      uint64_t n = st__varint(b);
      if (b->bad || n > (uint64_t)(b->e - b->p)) {
        b->bad = true;
        break;
      }
      *out_b = b->p;
      *out_e = b->p + n;
      b->p += n;
      break;
    }
    default:
      b->bad = true; /* groups (3, 4) are not in XLA's protos */
  }
  return !b->bad && *num > 0;
}

typedef struct st__comp {
  int64_t id;
  int64_t ops;
} st__comp;

typedef struct st__fus {
  char name[64];
  char kind[16];
  int64_t called; /* computation id; -1 none */
} st__fus;

static void st__copy(char* dst, size_t cap, const uint8_t* b, const uint8_t* e) {
  size_t n = (size_t)(e - b);
  if (n >= cap) n = cap - 1;
  memcpy(dst, b, n);
  dst[n] = '\0';
}

static bool st__eq(const uint8_t* b, const uint8_t* e, const char* s) {
  size_t n = strlen(s);
  return (size_t)(e - b) == n && !memcmp(b, s, n);
}

st_status st_ir_hlo_summarize(const void* bytes, size_t size, const char* format, const char* name,
                              st_ir_hlo_summary* out) {
  memset(out, 0, sizeof(*out));
  if (!name) name = "<hlo>";
  if (!bytes || size == 0) return st_status_make(ST_CODE_RUNTIME, "%s: an empty optimized program", name);
  if (format && strcmp(format, "hlo") && strcmp(format, "hlo_with_config"))
    return st_status_make(ST_CODE_RUNTIME, "%s: optimized program in format '%s', not hlo or hlo_with_config", name,
                          format);
  st__pb b = {(const uint8_t*)bytes, (const uint8_t*)bytes + size, false};
  const uint8_t *mb = b.p, *me = b.e;
  uint32_t num;
  int type;
  const uint8_t *fb, *fe;
  uint64_t v;
  if (format && !strcmp(format, "hlo_with_config")) {
    mb = me = NULL;
    while (st__field(&b, &num, &type, &fb, &fe, &v))
      if (num == 1 && type == 2) mb = fb, me = fe;
    if (b.bad || !mb) return st_status_make(ST_CODE_RUNTIME, "%s: not an HloModuleProtoWithConfig", name);
  }
  st__pb m = {mb, me, false};
  const uint8_t *entry_b = NULL, *entry_e = NULL;
  st__comp* comps = NULL;
  size_t n_comps = 0, cap_comps = 0;
  st__fus* fus = NULL;
  size_t n_fus = 0, cap_fus = 0;
  bool bad = false;
  while (!bad && st__field(&m, &num, &type, &fb, &fe, &v)) {
    if (num == 2 && type == 2) {
      entry_b = fb, entry_e = fe;
      continue;
    }
    if (num != 3 || type != 2) continue;
    if (n_comps >= ST__HLO_MAX_COMPUTATIONS) {
      bad = true;
      break;
    }
    /* One computation: its name, id and instructions. */
    st__pb c = {fb, fe, false};
    const uint8_t *cn_b = NULL, *cn_e = NULL;
    int64_t id = -1, ops = 0;
    const uint8_t *ib, *ie;
    uint32_t cnum;
    int ctype;
    uint64_t cv;
    while (st__field(&c, &cnum, &ctype, &ib, &ie, &cv)) {
      if (cnum == 1 && ctype == 2) cn_b = ib, cn_e = ie;
      if (cnum == 5 && ctype == 0) id = (int64_t)cv;
      if (cnum != 2 || ctype != 2) continue;
      ++ops;
      st__pb in = {ib, ie, false};
      const uint8_t *xb, *xe, *nb = NULL, *ne = NULL, *ob = NULL, *oe = NULL, *kb = NULL, *ke = NULL;
      int64_t called = -1;
      uint32_t inum;
      int itype;
      uint64_t iv;
      while (st__field(&in, &inum, &itype, &xb, &xe, &iv)) {
        if (inum == 1 && itype == 2) nb = xb, ne = xe;
        else if (inum == 2 && itype == 2) ob = xb, oe = xe;
        else if (inum == 11 && itype == 2) kb = xb, ke = xe;
        else if (inum == 38 && itype == 0 && called < 0) called = (int64_t)iv;
        else if (inum == 38 && itype == 2 && called < 0 && xe > xb) {
          st__pb packed = {xb, xe, false};
          called = (int64_t)st__varint(&packed);
          if (packed.bad) in.bad = true;
        }
      }
      if (in.bad) c.bad = true;
      if (ob && st__eq(ob, oe, "fusion")) {
        if (n_fus == cap_fus) {
          cap_fus = cap_fus ? cap_fus * 2 : 64;
          fus = st_xrealloc(fus, cap_fus * sizeof(*fus));
        }
        st__fus* f = &fus[n_fus++];
        memset(f, 0, sizeof(*f));
        if (nb) st__copy(f->name, sizeof(f->name), nb, ne);
        if (kb) st__copy(f->kind, sizeof(f->kind), kb, ke);
        f->called = called;
      }
    }
    if (c.bad) {
      bad = true;
      break;
    }
    if (n_comps == cap_comps) {
      cap_comps = cap_comps ? cap_comps * 2 : 64;
      comps = st_xrealloc(comps, cap_comps * sizeof(*comps));
    }
    comps[n_comps++] = (st__comp){id, ops};
    out->instructions += ops;
    if (entry_b && cn_b && cn_e - cn_b == entry_e - entry_b && !memcmp(cn_b, entry_b, (size_t)(cn_e - cn_b)))
      out->entry_instructions = ops;
  }
  if (bad || m.bad || n_comps == 0) {
    free(comps);
    free(fus);
    memset(out, 0, sizeof(*out));
    return st_status_make(ST_CODE_RUNTIME, "%s: not a readable HloModuleProto (%s)", name,
                          n_comps == 0 && !bad && !m.bad ? "no computations" : "malformed bytes");
  }
  /* Serialized in field order: the entry's name (2) precedes the
   * computations (3), so entry_instructions is known by now. */
  out->computations = (int64_t)n_comps;
  out->fusions = (int64_t)n_fus;
  for (size_t i = 0; i < n_fus; ++i) {
    int64_t ops = 0;
    for (size_t k = 0; k < n_comps; ++k)
      if (comps[k].id == fus[i].called) {
        ops = comps[k].ops;
        break;
      }
    /* Insert into the top list, largest first. */
    int at = out->n_top;
    while (at > 0 && out->top[at - 1].ops < ops) --at;
    if (at >= ST_IR_HLO_TOP) continue;
    int last = out->n_top < ST_IR_HLO_TOP ? out->n_top : ST_IR_HLO_TOP - 1;
    for (int k = last; k > at; --k) out->top[k] = out->top[k - 1];
    st_ir_fusion* t = &out->top[at];
    memcpy(t->name, fus[i].name, sizeof(t->name));
    memcpy(t->kind, fus[i].kind, sizeof(t->kind));
    t->ops = ops;
    if (out->n_top < ST_IR_HLO_TOP) out->n_top++;
  }
  free(comps);
  free(fus);
  return ST_OK;
}
