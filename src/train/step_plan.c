/* step_plan.c — builds the per-step plan from the bundle's layer and
 * parameter tables and the sched.* policies (docs/scheduling.md;
 * docs/bundle.md gives each program's inputs and outputs, and this file is
 * where their order is relied on).
 *
 * The builder emits the logical step (forward, backward with remat,
 * optimizer after the backward or per layer); st_plan_offload then weaves
 * in the host-memory moves and st_plan_add_waits the waits.
 *
 * Slot names: parameters by their bundle name ("layers.1.wq"); "grad:",
 * "gtmp:" (a later microbatch's gradient before accumulation), "m:", "v:"
 * prefixes; activations "x[l]" (block l's input), "res[l].<name>" (block
 * l's residuals), "y_re" (a recomputed output nobody reads) and "dx"; batch
 * tensors "tokens[m]", "targets[m]", "mask[m]"; scalars "loss[m]", "sq[i]",
 * "step", "lr", "gscale", "hyper"; host homes "host:<slot>". */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/train.h"

#define ST__MAX_GROUP_PARAMS 32

/* One instance of a parameter group: the embedding, block l, or the head. */
typedef struct {
  const char* group;
  int layer; /* -1 for embed/head */
  int count;
  int params[ST__MAX_GROUP_PARAMS]; /* indices into bundle->params, group order */
} st__instance;

static st_status st__instance_make(const st_bundle* b, const char* group, int layer, st__instance* out) {
  const st_bundle_group* g = st_bundle_group_find(b, group);
  if (!g) return st_status_make(ST_CODE_RUNTIME, "bundle %s: no parameter group '%s'", b->dir, group);
  if (g->param_count > ST__MAX_GROUP_PARAMS)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: group '%s' has too many parameters", b->dir, group);
  out->group = g->name;
  out->layer = layer;
  out->count = g->param_count;
  for (int k = 0; k < g->param_count; ++k) {
    out->params[k] = -1;
    for (int i = 0; i < b->param_count; ++i) {
      const st_bundle_param* p = &b->params[i];
      if (!strcmp(p->group, group) && p->layer == layer && !strcmp(p->local, g->params[k])) out->params[k] = i;
    }
    if (out->params[k] < 0)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: parameter table lacks '%s' of group '%s' layer %d", b->dir,
                            g->params[k], group, layer);
  }
  return ST_OK;
}

/* All group instances in the order the optimizer and the norm use them:
 * embed, layers 0..L-1, head. */
static st_status st__instances(const st_bundle* b, st__instance** out, int* out_count) {
  int n = (int)b->model.n_layers + 2;
  st__instance* v = st_xcalloc((size_t)n, sizeof(*v));
  st_status s = st__instance_make(b, "embed", -1, &v[0]);
  for (int l = 0; !s && l < b->model.n_layers; ++l) s = st__instance_make(b, "block", l, &v[1 + l]);
  if (!s) s = st__instance_make(b, "head", -1, &v[n - 1]);
  if (s) {
    free(v);
    return s;
  }
  *out = v;
  *out_count = n;
  return ST_OK;
}

typedef struct {
  st_plan* plan;
  const st_bundle* bundle;
} st__builder;

static int st__pslot(st__builder* B, const char* prefix, int param, st_slot_category cat, bool persistent) {
  const st_bundle_param* p = &B->bundle->params[param];
  char name[256];
  snprintf(name, sizeof(name), "%s%s", prefix, p->name);
  return st_plan_slot(B->plan, name, cat, &p->type, persistent);
}

/* The inputs of head_loss and head_eval, in their order: head params, the
 * tied embedding (|E| non-NULL), then x, targets, mask. Returns the count. */
static int st__head_inputs(st__builder* B, const st__instance* H, const st__instance* E, int x, int tgt, int mask,
                           int* in) {
  int n = 0;
  for (int k = 0; k < H->count; ++k) in[n++] = st__pslot(B, "", H->params[k], ST_SLOT_PARAM, true);
  if (E) in[n++] = st__pslot(B, "", E->params[0], ST_SLOT_PARAM, true);
  in[n++] = x;
  in[n++] = tgt;
  in[n++] = mask;
  return n;
}

static const st_bundle_program* st__prog(st__builder* B, const char* name, st_status* s) {
  const st_bundle_program* p = st_bundle_program_find(B->bundle, name);
  if (!p && !*s) *s = st_status_make(ST_CODE_RUNTIME, "bundle %s has no program '%s'", B->bundle->dir, name);
  return p;
}

static int st__act(st__builder* B, const char* name, const st_tensor_type* t) {
  return st_plan_slot(B->plan, name, ST_SLOT_ACT, t, false);
}

static int st__xfer(st__builder* B, const char* name, const st_tensor_type* t) {
  return st_plan_slot(B->plan, name, ST_SLOT_XFER, t, false);
}

/* Emits the forward pass of microbatch |m| up to x[L]; returns the slots of
 * tokens[m], targets[m], mask[m] and x[L]. Layers with remat[l] (and every
 * layer of an evaluation) run block_fwd and keep only x[l]; the others run
 * block_fwd_res and keep their residuals for block_bwd_res. */
static st_status st__forward(st__builder* B, const st__instance* inst, int n_inst, int m, bool eval, const bool* remat,
                             int* tok, int* tgt, int* mask, int* x_last) {
  st_status s = ST_OK;
  const st_bundle_program* ef = st__prog(B, "embed_fwd", &s);
  const st_bundle_program* bf = st__prog(B, "block_fwd", &s);
  const st_bundle_program* br = eval ? NULL : st__prog(B, "block_fwd_res", &s);
  if (s) return s;
  char name[64];
  snprintf(name, sizeof(name), "tokens[%d]", m);
  *tok = st__xfer(B, name, &ef->inputs[1].type);
  snprintf(name, sizeof(name), "targets[%d]", m);
  *tgt = st__xfer(B, name, &ef->inputs[1].type);
  st_tensor_type mt = ef->inputs[1].type;
  mt.dtype = ST_DTYPE_F32;
  snprintf(name, sizeof(name), "mask[%d]", m);
  *mask = st__xfer(B, name, &mt);
  st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_TOKENS : ST_TAG_TOKENS, 0, NULL, 1, tok);
  st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_TARGETS : ST_TAG_TARGETS, 0, NULL, 1, tgt);
  st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_MASK : ST_TAG_MASK, 0, NULL, 1, mask);

  int x0 = st__act(B, "x[0]", &ef->outputs[0].type);
  int in[ST__MAX_GROUP_PARAMS + 8], out[ST__MAX_GROUP_PARAMS + 8];
  in[0] = st__pslot(B, "", inst[0].params[0], ST_SLOT_PARAM, true);
  in[1] = *tok;
  st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, "embed_fwd"), -1, m, 0, 2, in, 1, &x0);
  if (eval) st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, tok, 0, NULL);
  int x = x0;
  for (int l = 0; l < n_inst - 2; ++l) {
    const st__instance* I = &inst[1 + l];
    for (int k = 0; k < I->count; ++k) in[k] = st__pslot(B, "", I->params[k], ST_SLOT_PARAM, true);
    in[I->count] = x;
    snprintf(name, sizeof(name), "x[%d]", l + 1);
    int y = st__act(B, name, &bf->outputs[0].type);
    if (eval || remat[l]) {
      st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, "block_fwd"), l, m, 0, I->count + 1, in, 1, &y);
    } else {
      out[0] = y;
      for (int r = 1; r < br->output_count; ++r) {
        snprintf(name, sizeof(name), "res[%d].%s", l, br->outputs[r].name);
        out[r] = st__act(B, name, &br->outputs[r].type);
      }
      st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, "block_fwd_res"), l, m, 0, I->count + 1, in,
                  br->output_count, out);
    }
    /* Evaluation keeps nothing for a backward pass. */
    if (eval) st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, 1, &x, 0, NULL);
    x = y;
  }
  *x_last = x;
  return ST_OK;
}

/* Adds "accum_<group>(grad..., gtmp...) -> grad..." and frees the gtmp. */
static void st__accumulate(st__builder* B, const st__instance* I, const char* tmp_prefix, int m, int only_param) {
  int in[2 * ST__MAX_GROUP_PARAMS], out[ST__MAX_GROUP_PARAMS], n = 0;
  for (int k = 0; k < I->count; ++k) {
    if (only_param >= 0 && I->params[k] != only_param) continue;
    in[n] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
    out[n] = in[n];
    ++n;
  }
  for (int k = 0, j = 0; k < I->count; ++k) {
    if (only_param >= 0 && I->params[k] != only_param) continue;
    in[n + j++] = st__pslot(B, tmp_prefix, I->params[k], ST_SLOT_GRAD, false);
  }
  char prog[64];
  snprintf(prog, sizeof(prog), "accum_%s", I->group);
  st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, prog), I->layer, m, 0, 2 * n, in, n, out);
  st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, m, 0, n, in + n, 0, NULL);
}

/* sqnorm_<group>(grads...) -> sq[i] for group instance |i|. */
static int st__sqnorm(st__builder* B, const st__instance* I, int i) {
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  int in[ST__MAX_GROUP_PARAMS];
  char name[64];
  for (int k = 0; k < I->count; ++k) in[k] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
  snprintf(name, sizeof(name), "sq[%d]", i);
  int sq = st__xfer(B, name, &scalar);
  snprintf(name, sizeof(name), "sqnorm_%s", I->group);
  st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, name), I->layer, -1, 0, I->count, in, 1, &sq);
  return sq;
}

/* adamw_<group>(params, grads, m, v, step, lr, gscale, hyper) -> params, m, v;
 * then the gradients are freed. |sc| holds the four scalar slots. */
static void st__adamw(st__builder* B, const st__instance* I, const int* sc) {
  int in[4 * ST__MAX_GROUP_PARAMS + 8], out[3 * ST__MAX_GROUP_PARAMS];
  int n = 0, no = 0;
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "", I->params[k], ST_SLOT_PARAM, true);
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "m:", I->params[k], ST_SLOT_OPT, true);
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "v:", I->params[k], ST_SLOT_OPT, true);
  for (int j = 0; j < 4; ++j) in[n++] = sc[j];
  for (int k = 0; k < I->count; ++k) out[no++] = in[k];
  for (int k = 0; k < I->count; ++k) out[no++] = in[2 * I->count + k];
  for (int k = 0; k < I->count; ++k) out[no++] = in[3 * I->count + k];
  char name[64];
  snprintf(name, sizeof(name), "adamw_%s", I->group);
  st_plan_add(B->plan, ST_OP_LAUNCH, st_plan_program(B->plan, name), I->layer, -1, 0, n, in, no, out);
  st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, -1, 0, I->count, in + I->count, 0, NULL);
}

/* The four optimizer scalars, filled by the trainer once lr and gscale are known. */
static void st__scalars(st__builder* B, int* sc) {
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  const st_tensor_type hyper = {ST_DTYPE_F32, 1, {4}};
  sc[0] = st__xfer(B, "step", &scalar);
  sc[1] = st__xfer(B, "lr", &scalar);
  sc[2] = st__xfer(B, "gscale", &scalar);
  sc[3] = st__xfer(B, "hyper", &hyper);
  const int tags[4] = {ST_TAG_STEP, ST_TAG_LR, ST_TAG_GSCALE, ST_TAG_HYPER};
  for (int j = 0; j < 4; ++j) st_plan_add(B->plan, ST_OP_H2D, -1, -1, -1, tags[j], 0, NULL, 1, &sc[j]);
}

/* sched.optimizer=per_layer: instance |i| is final once its last
 * microbatch's gradient is accumulated: take its norm and update it now. */
static void st__update_now(st__builder* B, const st__instance* I, int i, const int* sc, int* sq) {
  sq[i] = st__sqnorm(B, I, i);
  st__adamw(B, I, sc);
}

/* Offload units: optimizer state per group instance, parameters per block
 * (the embedding and head, used at both ends of the step, stay). */
static int* st__offload_units(const st_plan* plan, const st_bundle* b, const st__instance* inst, int n_inst, int offload) {
  int* unit = st_xmalloc(((size_t)plan->slot_count + 1) * sizeof(int));
  for (int s = 0; s < plan->slot_count; ++s) unit[s] = -1;
  int next = 0;
  for (int i = 0; i < n_inst; ++i) {
    bool opt = offload & ST_OFFLOAD_OPTIMIZER, par = (offload & ST_OFFLOAD_PARAMS) && inst[i].layer >= 0;
    if (!opt && !par) continue;
    int u_opt = opt ? next++ : -1, u_par = par ? next++ : -1;
    for (int k = 0; k < inst[i].count; ++k) {
      const char* pname = b->params[inst[i].params[k]].name;
      char name[300];
      int s;
      if (par && (s = st_plan_slot_find(plan, pname)) >= 0) unit[s] = u_par;
      snprintf(name, sizeof(name), "m:%s", pname);
      if (opt && (s = st_plan_slot_find(plan, name)) >= 0) unit[s] = u_opt;
      snprintf(name, sizeof(name), "v:%s", pname);
      if (opt && (s = st_plan_slot_find(plan, name)) >= 0) unit[s] = u_opt;
    }
  }
  return unit;
}

/* Logical plan -> offload pass -> wait pass -> finalize. Takes |logical|. */
static st_status st__apply_policies(st_plan* logical, const st_bundle* b, const st__instance* inst, int n_inst,
                                    const st_sched_policy* p, int offload, st_plan* out) {
  st_plan off;
  int* unit = st__offload_units(logical, b, inst, n_inst, offload);
  st_status s = st_plan_offload(logical, unit, p->prefetch_depth, &off);
  free(unit);
  st_plan_deinit(logical);
  if (s) return s;
  st_plan_add_waits(&off, p->eager, out);
  st_plan_deinit(&off);
  s = st_plan_finalize(out);
  if (s) st_plan_deinit(out);
  return s;
}

st_status st_train_build_plans(const st_bundle* b, const st_train_options* o, st_plan* step_out, st_plan* eval_out) {
  st_plan_init(step_out);
  st_plan_init(eval_out);
  const st_sched_policy* pol = &o->sched;
  st__instance* inst = NULL;
  int n_inst = 0;
  ST_RETURN(st__instances(b, &inst, &n_inst));
  const int L = n_inst - 2;
  const int M = (int)o->microbatches;
  const bool tied = b->model.tie_embeddings;
  const bool per_layer = pol->per_layer_optimizer;
  if (per_layer && o->grad_clip > 0) {
    free(inst);
    return st_status_make(ST_CODE_CONFIG,
                          "sched.optimizer=per_layer updates each layer before the global gradient norm is known, so it "
                          "cannot clip (train.grad_clip is %g); set train.grad_clip=0 or sched.optimizer=after_backward",
                          o->grad_clip);
  }
  bool* remat = st_xcalloc((size_t)L + 1, sizeof(bool));
  st_status s = st_sched_remat_parse(pol->remat, L, remat);
  if (s) {
    free(remat);
    free(inst);
    return s;
  }
  const st__instance* E = &inst[0];
  const st__instance* H = &inst[n_inst - 1];
  st_plan step, eval;
  st_plan_init(&step);
  st_plan_init(&eval);
  st__builder B = {&step, b};
  const st_bundle_program* hl = st__prog(&B, "head_loss", &s);
  const st_bundle_program* br = st__prog(&B, "block_fwd_res", &s);
  const st_bundle_program* bb = st__prog(&B, "block_bwd_res", &s);
  if (!s && (bb->input_count != inst[1].count + br->output_count + 1 || bb->output_count != inst[1].count + 1))
    s = st_status_make(ST_CODE_RUNTIME, "bundle %s: block_bwd_res does not take block_fwd_res's residuals (docs/bundle.md)",
                       b->dir);
  if (s) {
    free(remat);
    free(inst);
    return s;
  }
  const int R = br->output_count - 1; /* residuals per layer */
  char name[64];
  int in[4 * ST__MAX_GROUP_PARAMS + 16], out[4 * ST__MAX_GROUP_PARAMS + 16];
  int sc[4] = {-1, -1, -1, -1};
  int* sq = st_xcalloc((size_t)n_inst, sizeof(int));

  /* Persistent state first, so slot numbering is stable and readable. */
  for (int i = 0; i < n_inst; ++i)
    for (int k = 0; k < inst[i].count; ++k) st__pslot(&B, "", inst[i].params[k], ST_SLOT_PARAM, true);
  for (int i = 0; i < n_inst; ++i)
    for (int k = 0; k < inst[i].count; ++k) {
      st__pslot(&B, "m:", inst[i].params[k], ST_SLOT_OPT, true);
      st__pslot(&B, "v:", inst[i].params[k], ST_SLOT_OPT, true);
    }

  /* --- forward and backward, microbatch by microbatch ------------------ */
  for (int m = 0; m < M && !s; ++m) {
    const char* gp = m == 0 ? "grad:" : "gtmp:";
    const bool last = m == M - 1;
    int tok, tgt, mask, x;
    s = st__forward(&B, inst, n_inst, m, false, remat, &tok, &tgt, &mask, &x);
    if (s) break;
    if (last && per_layer) {
      /* No clipping: lr and gscale are known before any gradient. */
      st_plan_add(&step, ST_OP_HOST, -1, -1, -1, ST_TAG_SCHEDULE, 0, NULL, 0, NULL);
      st__scalars(&B, sc);
    }
    /* head_loss(head params, [wte], x, targets, mask) -> loss, head grads, [dwte], dx */
    int n = st__head_inputs(&B, H, tied ? E : NULL, x, tgt, mask, in);
    snprintf(name, sizeof(name), "loss[%d]", m);
    int no = 0;
    out[no++] = st__xfer(&B, name, &hl->outputs[0].type);
    for (int k = 0; k < H->count; ++k) out[no++] = st__pslot(&B, gp, H->params[k], ST_SLOT_GRAD, false);
    if (tied) out[no++] = st__pslot(&B, "hgrad:", E->params[0], ST_SLOT_GRAD, false);
    int dx = st__act(&B, "dx", &hl->outputs[hl->output_count - 1].type);
    out[no++] = dx;
    st_plan_add(&step, ST_OP_LAUNCH, st_plan_program(&step, "head_loss"), -1, m, 0, n, in, no, out);
    int freed[3] = {x, tgt, mask};
    st_plan_add(&step, ST_OP_FREE, -1, -1, m, 0, 3, freed, 0, NULL);
    if (m > 0) st__accumulate(&B, H, "gtmp:", m, -1);
    if (last && per_layer) st__update_now(&B, H, n_inst - 1, sc, sq);

    /* Backward in reverse layer order: block_bwd_res(params, x, residuals, dy)
     * -> grads..., dx. A remat layer first recomputes its residuals. */
    for (int l = L - 1; l >= 0; --l) {
      const st__instance* I = &inst[1 + l];
      snprintf(name, sizeof(name), "x[%d]", l);
      int xl = st__act(&B, name, &br->inputs[I->count].type);
      int res[32];
      for (int r = 0; r < R && r < 32; ++r) {
        snprintf(name, sizeof(name), "res[%d].%s", l, br->outputs[1 + r].name);
        res[r] = st__act(&B, name, &br->outputs[1 + r].type);
      }
      n = 0;
      for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(&B, "", I->params[k], ST_SLOT_PARAM, true);
      in[n++] = xl;
      if (remat[l]) {
        int y_re = st__act(&B, "y_re", &br->outputs[0].type);
        out[0] = y_re;
        for (int r = 0; r < R; ++r) out[1 + r] = res[r];
        st_plan_add(&step, ST_OP_RECOMPUTE, st_plan_program(&step, "block_fwd_res"), l, m, 0, n, in, 1 + R, out);
        st_plan_add(&step, ST_OP_FREE, -1, l, m, 0, 1, &y_re, 0, NULL);
      }
      for (int r = 0; r < R; ++r) in[n++] = res[r];
      in[n++] = dx;
      no = 0;
      for (int k = 0; k < I->count; ++k) out[no++] = st__pslot(&B, gp, I->params[k], ST_SLOT_GRAD, false);
      out[no++] = dx;
      st_plan_add(&step, ST_OP_LAUNCH, st_plan_program(&step, "block_bwd_res"), l, m, 0, n, in, no, out);
      int dead[33];
      dead[0] = xl;
      for (int r = 0; r < R; ++r) dead[1 + r] = res[r];
      st_plan_add(&step, ST_OP_FREE, -1, l, m, 0, 1 + R, dead, 0, NULL);
      if (m > 0) st__accumulate(&B, I, "gtmp:", m, -1);
      if (last && per_layer) st__update_now(&B, I, 1 + l, sc, sq);
    }
    /* embed_bwd(wte, tokens, dx) -> dwte */
    in[0] = st__pslot(&B, "", E->params[0], ST_SLOT_PARAM, true);
    in[1] = tok;
    in[2] = dx;
    out[0] = st__pslot(&B, gp, E->params[0], ST_SLOT_GRAD, false);
    st_plan_add(&step, ST_OP_LAUNCH, st_plan_program(&step, "embed_bwd"), -1, m, 0, 3, in, 1, out);
    int freed2[2] = {dx, tok};
    st_plan_add(&step, ST_OP_FREE, -1, -1, m, 0, 2, freed2, 0, NULL);
    if (m > 0) st__accumulate(&B, E, "gtmp:", m, -1);
    if (tied) st__accumulate(&B, E, "hgrad:", m, E->params[0]);
    if (last && per_layer) st__update_now(&B, E, 0, sc, sq);
  }

  /* --- losses and the global gradient norm ----------------------------- */
  for (int m = 0; m < M && !s; ++m) {
    snprintf(name, sizeof(name), "loss[%d]", m);
    int ls = st_plan_slot_find(&step, name);
    st_plan_add(&step, ST_OP_READ, -1, -1, m, ST_TAG_LOSS, 1, &ls, 0, NULL);
    st_plan_add(&step, ST_OP_FREE, -1, -1, m, 0, 1, &ls, 0, NULL);
  }
  /* All norms are launched before the first read: one wait, not n_inst. */
  for (int i = 0; i < n_inst && !s && !per_layer; ++i) sq[i] = st__sqnorm(&B, &inst[i], i);
  for (int i = 0; i < n_inst && !s; ++i) {
    st_plan_add(&step, ST_OP_READ, -1, inst[i].layer, i, ST_TAG_SQNORM, 1, &sq[i], 0, NULL);
    st_plan_add(&step, ST_OP_FREE, -1, inst[i].layer, i, 0, 1, &sq[i], 0, NULL);
  }
  if (!s) {
    st_plan_add(&step, ST_OP_HOST, -1, -1, -1, ST_TAG_CLIP, 0, NULL, 0, NULL);
    /* --- AdamW per group instance, after the backward ------------------ */
    if (!per_layer) {
      st__scalars(&B, sc);
      for (int i = 0; i < n_inst; ++i) st__adamw(&B, &inst[i], sc);
    }
    st_plan_add(&step, ST_OP_FREE, -1, -1, -1, 0, 4, sc, 0, NULL);
  }
  free(sq);

  /* --- evaluation plan: forward and loss only -------------------------- */
  B.plan = &eval;
  for (int i = 0; i < n_inst && !s; ++i)
    for (int k = 0; k < inst[i].count; ++k) st__pslot(&B, "", inst[i].params[k], ST_SLOT_PARAM, true);
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  const int EM = (int)(o->eval_batches * o->microbatches);
  for (int m = 0; m < EM && !s; ++m) {
    int tok, tgt, mask, x;
    s = st__forward(&B, inst, n_inst, m, true, remat, &tok, &tgt, &mask, &x);
    if (s) break;
    int n = st__head_inputs(&B, H, tied ? E : NULL, x, tgt, mask, in);
    int loss = st__xfer(&B, "eval_loss", &scalar);
    st_plan_add(&eval, ST_OP_LAUNCH, st_plan_program(&eval, "head_eval"), -1, m, 0, n, in, 1, &loss);
    int freed[3] = {x, tgt, mask};
    st_plan_add(&eval, ST_OP_FREE, -1, -1, m, 0, 3, freed, 0, NULL);
    st_plan_add(&eval, ST_OP_READ, -1, -1, m, ST_TAG_EVAL_LOSS, 1, &loss, 0, NULL);
    st_plan_add(&eval, ST_OP_FREE, -1, -1, m, 0, 1, &loss, 0, NULL);
  }
  free(remat);

  /* --- policies: offload, waits ----------------------------------------- */
  char policy[256];
  snprintf(policy, sizeof(policy), "remat=%s offload=%s prefetch_depth=%d wait=%s optimizer=%s",
           pol->remat && pol->remat[0] ? pol->remat : "full",
           pol->offload == 3 ? "both" : pol->offload == ST_OFFLOAD_OPTIMIZER ? "optimizer"
                                    : pol->offload == ST_OFFLOAD_PARAMS  ? "params"
                                                                         : "none",
           pol->prefetch_depth, pol->eager ? "eager" : "deferred", per_layer ? "per_layer" : "after_backward");
  if (!s) s = st__apply_policies(&step, b, inst, n_inst, pol, pol->offload, step_out);
  else st_plan_deinit(&step);
  /* Evaluation has no optimizer state; offloaded parameters stream as in training. */
  if (!s) s = st__apply_policies(&eval, b, inst, n_inst, pol, pol->offload & ST_OFFLOAD_PARAMS, eval_out);
  else st_plan_deinit(&eval);
  free(inst);
  if (s) {
    st_plan_deinit(step_out);
    st_plan_deinit(eval_out);
    return s;
  }
  st_plan_set_policy(step_out, policy);
  st_plan_set_policy(eval_out, policy);
  return ST_OK;
}
