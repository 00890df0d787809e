/*
 * ir/ir_internal.h — what the files of src/ir/ share: the reader of
 * StableHLO's MLIR text (reader.c) and the op classes (classify.c), used by
 * the cost pass (cost.c) and the dataflow graph (graph.c). Not for other
 * modules: they use strata/ir.h.
 */
#ifndef STRATA_IR_INTERNAL_H
#define STRATA_IR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/ir.h"

#define ST__IR_MAX_REGIONS 16
#define ST__IR_SIG_KEEP 4 /* operand and result types kept per op */

typedef struct st__ir_func {
  const char* name;
  size_t name_len;
  const char* sig_b; /* "(" of the arguments .. the body's "{" */
  const char* sig_e;
  const char* body_b; /* inside the braces */
  const char* body_e;
} st__ir_func;

/* A type signature: "(ins) -> outs" or a plain list "t, t" (results). */
typedef struct st__ir_sig {
  bool functional; /* "(ins) -> outs" */
  int n_in, n_out;
  st_ir_type in[ST__IR_SIG_KEEP], out[ST__IR_SIG_KEEP];
  double in_bytes, out_bytes;
} st__ir_sig;

typedef struct st__ir_op {
  const char* b; /* first char of the op (results or name) */
  const char* e; /* end (the newline or region end) */
  char name[64];
  const char* after_name;
  const char* colon; /* last top-level ':' (the signature), or NULL */
  int n_regions;
  const char* rb[ST__IR_MAX_REGIONS];
  const char* re[ST__IR_MAX_REGIONS];
  int n_operands; /* '%' tokens between the name and the signature, outside regions */
} st__ir_op;

typedef struct st__ir_ctx {
  const char* prog;
  const st__ir_func* cur_func; /* the function the static pass is in */
  const char* text;
  const char* end;
  st__ir_func* funcs;
  int n_funcs;
  int64_t visits;
  st_ir_stats* s;
  st_status err;
} st__ir_ctx;

/*--- the reader (reader.c) -------------------------------------------------*/

/* Records the first error, "<prog>:<line of |at|>: ...", ST_CODE_RUNTIME;
 * later ones are dropped. |at| NULL: line 1. */
void st__ir_fail(st__ir_ctx* c, const char* at, const char* what);
/* A character of an identifier or op name (letters, digits, _ . $ -). */
bool st__ir_ident(char ch);
bool st__ir_starts(const char* p, const char* e, const char* word);
/* Marks f64 and dynamic shapes in c->s when |t| has them. */
void st__ir_note_type(st__ir_ctx* c, const st_ir_type* t);
/* A comma-separated list [p, e) of types, added to |s|'s inputs (|in|) or outputs. */
void st__ir_sig_list(st__ir_ctx* c, const char* p, const char* e, bool in, st__ir_sig* s);
/* The signature after a top-level ':' up to |e| (regions excluded). */
void st__ir_parse_sig(st__ir_ctx* c, const char* p, const char* e, st__ir_sig* s);
/* Skips whitespace, `// comments` and block labels (`^bb0(...):`). */
const char* st__ir_skip_trivia(const char* p, const char* e);
/* Reads the op at |p| (after trivia) within [p, e). False (c->err set) on
 * malformed text. */
bool st__ir_read_op(st__ir_ctx* c, const char* p, const char* e, st__ir_op* op);
/* Every func.func of the text into c->funcs (c->err set on malformed text). */
void st__ir_read_funcs(st__ir_ctx* c);
/* The function @name, or NULL. */
const st__ir_func* st__ir_lookup(const st__ir_ctx* c, const char* name, size_t n);
/* FNV-1a of [s, s + n): the value-name tables of cost.c and graph.c. */
uint64_t st__ir_hash(const char* s, size_t n);
/* The name of the value at |p| ("%12" of "%12#3"), its length or 0. */
size_t st__ir_name_at(const char* p, const char* e);

/*--- op classes (classify.c) -----------------------------------------------*/

/* |name| without its dialect ("stablehlo.add" -> "add"; mhlo too). */
const char* st__ir_short(const char* name);
/* Of a full op name: a function's or region's terminator. */
bool st__ir_is_return(const char* name);
/* The rest take a short name (st__ir_short). */
bool st__ir_is_transc(const char* s);
bool st__ir_is_elementwise(const char* s);
bool st__ir_is_movement(const char* s);
bool st__ir_is_collective(const char* s);
bool st__ir_is_dynamic(const char* s);

#endif /* STRATA_IR_INTERNAL_H */
