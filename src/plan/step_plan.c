/* step_plan.c — builds the training step and the evaluation as plans, from
 * the bundle's program tables (which program plays which role for the
 * embedding, each block and the head: docs/bundle.md, "Program tables"), its
 * parameter table and the sched.* policies (docs/scheduling.md). No program
 * is named here: every name comes from the bundle. docs/bundle.md gives
 * each program's inputs and outputs, and this file is where their order is
 * relied on.
 *
 * One training step, as st_plan_build emits it:
 *
 *   state          parameters, then optimizer state (slot numbers stable)
 *   for each microbatch m:
 *     forward      batch H2D; embed fwd; per block fwd_res (keeps the
 *                  residuals) or, for a remat layer, fwd (keeps only x)
 *     backward     head loss; per block in reverse: (remat: RECOMPUTE
 *                  fwd_res) bwd_res; embed bwd; later microbatches'
 *                  gradients accumulated into the first's
 *   losses         READ each microbatch's loss
 *   reduction      data parallelism: each group instance's gradient
 *                  all-reduce (COLLECTIVE) as soon as it is final, or in
 *                  buckets (sched.grad_reduce: st__grad_final)
 *   optimizer      norms, clip scale, AdamW per group instance — after the
 *                  backward, or per layer inside the last backward
 *                  (sched.optimizer: the one choice point, st__optimizer)
 *   policies       st_plan_offload weaves in the host-memory moves,
 *                  st_plan_add_waits the waits
 *
 * The evaluation: per microbatch the forward (fwd for every block) and the
 * head's eval program, then READ the loss.
 *
 * Slot names: parameters by their bundle name ("layers.1.wq"); "grad:",
 * "gtmp:" (a later microbatch's gradient before accumulation), "hgrad:"
 * (the tied embedding's gradient from the head), "<kind>:" optimizer
 * state (AdamW's "m:", "v:"; the update program's state inputs);
 * activations "x[l]" (block l's input), "res[l].<name>" (block l's
 * residuals), "y_re" (a recomputed output nobody reads) and "dx"; batch
 * tensors "tokens[m]", "targets[m]", "mask[m]"; block metrics
 * "metric[m][l].<name>" (read after the step; "metric_re.", "metric_eval."
 * are dropped); scalars "loss[m]", "sq[i]",
 * "step", "lr", "gscale", "hyper"; host homes "host:<slot>". */
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"
#include "strata/base.h"
#include "strata/plan.h"

#define ST__MAX_GROUP_PARAMS 32
#define ST__MAX_RESIDUALS 32
/* Room for any program's slots: params, grads, m, v and a few more. */
#define ST__MAX_IO (4 * ST__MAX_GROUP_PARAMS + ST__MAX_RESIDUALS + 16)

/*===-------------------------------------------------------------------===*/
/* Group instances and the builder's state                                  */
/*===-------------------------------------------------------------------===*/

/* One stage's parameters: the embedding, block l, or the head. */
typedef struct {
  const st_bundle_stage* stage;
  const st_bundle_group* group;
  int layer; /* -1 for embed/head */
  int count;
  int params[ST__MAX_GROUP_PARAMS]; /* indices into bundle->params, group order */
} st__instance;

static st_status st__instance_make(const st_bundle* b, const st_bundle_stage* stage, st__instance* out) {
  const st_bundle_group* g = stage->group;
  if (g->param_count > ST__MAX_GROUP_PARAMS)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: group '%s' has %d parameters, more than the %d strata handles",
                          b->dir, g->name, g->param_count, ST__MAX_GROUP_PARAMS);
  out->stage = stage;
  out->group = g;
  out->layer = stage->index;
  out->count = g->param_count;
  for (int k = 0; k < g->param_count; ++k) {
    out->params[k] = st_bundle_param_of(b, g->name, stage->index, g->params[k]);
    if (out->params[k] < 0)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: parameter table lacks '%s' of group '%s' layer %d", b->dir,
                            g->params[k], g->name, stage->index);
  }
  return ST_OK;
}

int st_plan_metric_outputs(const st_bundle_program* p) {
  int n = 0;
  while (1 + n < p->output_count && !strcmp(p->outputs[1 + n].role, "metric")) ++n;
  return n;
}

int st_plan_block_metrics(const st_bundle* b, const char** names, int* ranks) {
  const char* seen[ST_PLAN_MAX_METRICS];
  int n = 0;
  for (int l = 0; l < b->layer_count; ++l) {
    const st_bundle_program* f = b->layers[l].fwd;
    for (int s = 0; s < st_plan_metric_outputs(f); ++s) {
      const st_bundle_tensor* o = &f->outputs[1 + s];
      int k = 0;
      while (k < n && strcmp(seen[k], o->name) != 0) ++k;
      if (k < n || n == ST_PLAN_MAX_METRICS) continue;
      seen[n] = o->name;
      if (names) names[n] = o->name;
      if (ranks) ranks[n] = o->type.rank;
      ++n;
    }
  }
  return n;
}

static bool st__plan_same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; ++d)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

/* The index of metric |name| in st_plan_block_metrics' list, -1 if none. */
static int st__metric_index(const st_bundle* b, const char* name) {
  const char* names[ST_PLAN_MAX_METRICS];
  int n = st_plan_block_metrics(b, names, NULL);
  for (int k = 0; k < n; ++k)
    if (!strcmp(names[k], name)) return k;
  return -1;
}

/* data.packing=pack (docs/data.md): the embedding's forward takes each
 * token's position after the tokens, and so does every block after x
 * (their attention stays inside each document). 1 if so, else 0. */
static int st__takes_positions(const st_bundle* b) {
  const st_bundle_program* ef = b->embed.fwd;
  if (!ef || ef->input_count < 2) return 0;
  const st_bundle_tensor* last = &ef->inputs[ef->input_count - 1];
  return !strcmp(last->name, "positions") ? 1 : 0;
}

/* The programs a block's training needs fit together: fwd returns y and
 * the block's metrics, fwd_res the same then its residuals, and bwd_res
 * takes the block's parameters, x, the residuals and dy, and returns the
 * gradients and dx (docs/bundle.md). The metrics (role "metric": f32
 * scalars or vectors, e.g. an MoE layer's auxiliary loss) are read for the
 * metrics line; their share of the loss is the block's own business (its
 * bwd_res includes their gradient), so the plan never feeds them back. */
static st_status st__check_block(const st_bundle* b, const st__instance* I) {
  const st_bundle_program* fwd = I->stage->fwd;
  const st_bundle_program* fr = I->stage->fwd_res;
  const st_bundle_program* br = I->stage->bwd_res;
  const int S = st_plan_metric_outputs(fr), R = fr->output_count - 1 - S;
  const int pos = st__takes_positions(b);
  if (fr->output_count < 1 || R > ST__MAX_RESIDUALS || fr->input_count != I->count + 1 + pos ||
      fwd->input_count != I->count + 1 + pos || fwd->output_count != 1 + st_plan_metric_outputs(fwd))
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's programs '%s' and '%s' do not take its %d parameters and x%s, or "
                          "return more than %d residuals (docs/bundle.md)",
                          b->dir, I->layer, fwd->name, fr->name, I->count, pos ? " and positions" : "", ST__MAX_RESIDUALS);
  if (st_plan_metric_outputs(fwd) != S)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's '%s' and '%s' return different metrics (docs/bundle.md, "
                          "\"Block metrics\")", b->dir, I->layer, fwd->name, fr->name);
  for (int s = 0; s < S; ++s) {
    const st_bundle_tensor *a = &fwd->outputs[1 + s], *c = &fr->outputs[1 + s];
    if (strcmp(a->name, c->name) != 0 || !st__plan_same_type(&a->type, &c->type) || strlen(a->name) > 64 || a->type.dtype != ST_DTYPE_F32 ||
        a->type.rank > 1 || st__metric_index(b, a->name) < 0)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's metric output %d ('%s') is not the same f32 scalar or "
                            "vector in '%s' and '%s', or a name over 64 bytes or one too many (at most %d names; docs/bundle.md)",
                            b->dir, I->layer, s, a->name, fwd->name, fr->name, ST_PLAN_MAX_METRICS);
  }
  for (int r = 1 + S; r < fr->output_count; ++r)
    if (!strcmp(fr->outputs[r].role, "metric"))
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's '%s' returns metric '%s' among its residuals; metrics "
                            "come right after y (docs/bundle.md)", b->dir, I->layer, fr->name, fr->outputs[r].name);
  if (br->input_count != I->count + R + 2 + pos || br->output_count != I->count + 1)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's '%s' does not take '%s''s residuals (docs/bundle.md)",
                          b->dir, I->layer, br->name, fr->name);
  return ST_OK;
}

/* All group instances in the order the optimizer and the norm use them:
 * embed, layers 0..L-1, head. */
static st_status st__instances(const st_bundle* b, st__instance** out, int* out_count) {
  if (b->layer_count != b->model.n_layers)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: its layer table has %d rows for %lld layers", b->dir,
                          b->layer_count, (long long)b->model.n_layers);
  int n = b->layer_count + 2;
  st__instance* v = st_xcalloc((size_t)n, sizeof(*v));
  st_status s = st__instance_make(b, &b->embed, &v[0]);
  /* The embedding's programs take its group's parameters (wte first), then
   * tokens (and dx); the plan indexes them by the group's count. */
  const st_bundle_stage* E = &b->embed;
  const int ne = v[0].count, pos = st__takes_positions(b);
  if (!s && (ne < 1 || E->fwd->input_count != ne + 1 + pos || E->fwd->output_count != 1 || E->bwd->input_count != ne + 2 + pos ||
             E->bwd->output_count != ne ||
             (E->accum_tied && (E->accum_tied->input_count != 2 || E->accum_tied->output_count != 1))))
    s = st_status_make(ST_CODE_RUNTIME, "bundle %s: the embedding's programs do not match its group's %d parameters "
                       "(fwd: params, tokens[, positions] -> x; bwd: params, tokens[, positions], dx -> grads; accum_tied: 2 -> 1; "
                       "docs/bundle.md, \"Program tables\")", b->dir, ne);
  for (int l = 0; !s && l < b->layer_count; ++l) {
    s = st__instance_make(b, &b->layers[l], &v[1 + l]);
    if (!s) s = st__check_block(b, &v[1 + l]);
  }
  if (!s) s = st__instance_make(b, &b->head, &v[n - 1]);
  if (s) {
    free(v);
    return s;
  }
  *out = v;
  *out_count = n;
  return ST_OK;
}

/* The slots of one microbatch that the forward hands to the backward. */
typedef struct {
  int tokens, targets, mask;
  /* data.packing=pack: the positions slot + 1 on each stage (0: none yet;
   * st__positions makes it at its first use there). */
  int pos1[ST_PLAN_MAX_STAGES];
  int x;  /* the last block's output (a pipeline: the next chunk's input, once sent) */
  int dx; /* a pipeline: the gradient the next chunk's backward sent back; -1 */
} st__fwd_out;

typedef struct {
  st_plan* plan;
  const st_bundle* bundle;
  const st__instance* inst; /* embed, blocks, head */
  int n_inst;
  int L;              /* blocks */
  const bool* remat;  /* [L] */
  bool tied;          /* the head uses the embedding */
  bool positions;     /* data.packing=pack: embedding and blocks take positions (st__takes_positions) */
  int sc[ST_PLAN_MAX_STAGES][4]; /* optimizer scalar slots per stage: step, lr, gscale, hyper */
  int* sq;            /* [n_inst] squared-norm slots */
  /* Data parallelism (plan->devices > 1): reductions not yet issued. */
  bool bucketed;
  int64_t bucket_bytes;
  int* pending;       /* [n_inst] instances whose gradient is final, not yet reduced */
  int n_pending;
  int64_t pending_bytes;
  /* Fully-sharded data parallelism (F > 1): the persistent state is cut in
   * fsdp blocks; launches read gathered parameters ("full:" slots) that an
   * all-gather fills before the use (sched.gather_prefetch uses ahead) and
   * a FREE drops after it (sched.reshard_after_forward). */
  int F, data;
  int T; /* tensor parallelism: the block's parameters are its tensor-cut blocks */
  int gather_prefetch;
  bool reshard;
  struct st__use* uses; /* every parameter-using launch of the plan, in order */
  int n_uses, use_pos;
  bool* gathered;       /* [n_inst]: its "full:" slots hold the parameters now */
  /* diag.numerics (docs/diagnostics.md): ST_NUMERICS_*; the statistics
   * slots launched and not yet read: each instance's update_stats, and
   * (layer) each block output's and input gradient's act_stats with the
   * READ tag, layer and microbatch they are read with. */
  int numerics;
  int* nstat;           /* [n_inst]; -1: none */
  int* astat;           /* [n_astat * 4]: slot, tag, layer, micro */
  int n_astat, cap_astat;
  /* Data parallelism across processes (parallel.processes spanning data):
   * after the local reduction (if any), each final gradient is all-reduced
   * with the other processes by an XPROC op. 1: one process. */
  int xdata;
  /* fsdp across processes (parallel.fsdp spanning them): the state is cut
   * in one block per process (st_slot.xblocks), gathered and
   * reduce-scattered by XPROC ops. 1: one process, or data spans. */
  int X;
  /* Pipeline parallelism (parallel.pipeline > 1; docs/parallelism.md,
   * "Pipeline"): P stages, C = P x V model chunks, chunk c = layers
   * [first[c], first[c+1]) on stage c % P; the embedding on stage 0, the
   * head on stage P - 1. |stage| and |micro| say where the ops being
   * emitted run and for which microbatch (-1: none), which names and
   * places the slots they create (st__slot). P = 1: none of this. */
  int P, C;
  int* first;       /* [C + 1] */
  int* param_stage; /* [bundle params]: the stage of each parameter's instance */
  int stage, micro;
  int wte_copy;     /* tied embeddings: the last stage's copy of wte for the head; -1 */
  st__fwd_out* fo;  /* [microbatches]: what each microbatch's forward hands on */
  double *cfwd, *cbwd; /* [C]: each chunk's predicted forward and backward cost (st_plan_pipeline_layout) */
} st__builder;

/* The state is cut in fsdp blocks: over this process's devices (F), or
 * across the processes (X). */
static bool st__fsdp(const st__builder* B) { return B->F > 1 || B->X > 1; }

/* The stage group instance |i| lies on (0 without a pipeline). */
static int st__inst_stage(const st__builder* B, int i) {
  if (B->P <= 1) return 0;
  if (i == 0) return 0;
  if (i == B->n_inst - 1) return B->P - 1;
  int c = 0;
  while (B->first[c + 1] <= i - 1) ++c;
  return c % B->P;
}

/* One launch (or a block's recompute and backward) that reads parameters:
 * the group instances whose parameters it reads. */
typedef struct st__use {
  int inst[2];
  int n;
  bool forward; /* a forward use (the head's loss counts as backward) */
  int micro;
} st__use;


/* Every slot the builder makes: without a pipeline, |name| as it is. In a
 * pipeline a slot lies on one stage, and a microbatch's tensors of
 * different microbatches live at once (1F1B holds several in flight on a
 * stage), so a non-state slot is named for its stage ("x[2]@1") and, while
 * a microbatch's ops are emitted, its microbatch ("x[2]@1/m3"); state
 * (parameters, gradients, m, v) keeps its name on its instance's stage. */
static void st__qualify(const st__builder* B, const char* name, bool state, char* out, size_t size) {
  if (B->P <= 1 || state) snprintf(out, size, "%s", name);
  else if (B->micro >= 0) snprintf(out, size, "%s@%d/m%d", name, B->stage, B->micro);
  else snprintf(out, size, "%s@%d", name, B->stage);
}

static int st__slot(st__builder* B, const char* name, st_slot_category cat, const st_tensor_type* t, bool persistent,
                    bool state, int stage) {
  char q[320];
  st__qualify(B, name, state, q, sizeof(q));
  const int before = B->plan->slot_count;
  int k = st_plan_slot(B->plan, q, cat, t, persistent);
  if (k == before) B->plan->slots[k].stage = stage;
  return k;
}

/* Parameter |param| as one device holds it before any fsdp cut: under
 * tensor parallelism a block parameter is the block the tensor-parallel
 * programs take (their input of the same name: heads or MLP hidden units,
 * cut along *out_cut); otherwise, and for the embedding's and the head's,
 * the whole tensor (*out_cut = -1). */
static st_tensor_type st__tensor_local(const st__builder* B, int param, int* out_cut) {
  const st_bundle_param* p = &B->bundle->params[param];
  st_tensor_type t = p->type;
  *out_cut = -1;
  if (B->T <= 1 || p->layer < 0 || p->layer >= B->bundle->layer_count) return t;
  const st_bundle_program* fwd = B->bundle->layers[p->layer].fwd;
  for (int k = 0; k < fwd->input_count; ++k) {
    if (strcmp(fwd->inputs[k].name, p->local) != 0) continue;
    t = fwd->inputs[k].type;
    for (int d = 0; d < t.rank && d < p->type.rank; ++d)
      if (t.dims[d] != p->type.dims[d]) *out_cut = d;
  }
  return t;
}

/* A parameter's slot (or its gradient's, m's, v's: |prefix|). Under
 * tensor parallelism a block's state is its tensor block (st__tensor_local),
 * and under FSDP every state tensor is then cut in fsdp blocks: dim 0 in
 * ceil(d0 / fsdp) rows, the last zero-padded (a tensor block cut along dim
 * 0 is cut again inside: st_sharding.outer). Gradients are partial over
 * data until their all-reduce. The slot records the whole tensor and how
 * it is cut (st_slot.logical, .sharding). */
static int st__pslot(st__builder* B, const char* prefix, int param, st_slot_category cat, bool persistent) {
  const st_bundle_param* p = &B->bundle->params[param];
  char name[256];
  snprintf(name, sizeof(name), "%s%s", prefix, p->name);
  const bool state = cat == ST_SLOT_PARAM || cat == ST_SLOT_GRAD || cat == ST_SLOT_OPT;
  /* A pipeline's tied head gradient of wte ("hgrad:") is one microbatch's,
   * made on the last stage and sent to the first. */
  const bool per_micro = B->P > 1 && !strcmp(prefix, "hgrad:");
  const int stage = per_micro ? B->stage : B->param_stage[param];
  if (!state || (B->F <= 1 && B->T <= 1 && B->X <= 1)) return st__slot(B, name, cat, &p->type, persistent, !per_micro, stage);
  int cut = -1;
  st_tensor_type t = st__tensor_local(B, param, &cut);
  const st_tensor_type device_whole = t;
  const bool fsdp = B->F > 1 && t.rank > 0, xcut = B->X > 1 && t.rank > 0;
  if (fsdp) t.dims[0] = (t.dims[0] + B->F - 1) / B->F;
  if (xcut) t.dims[0] = (t.dims[0] + B->X - 1) / B->X;
  int slot = st__slot(B, name, cat, &t, persistent, !per_micro, stage);
  if (xcut) {
    B->plan->slots[slot].xblocks = B->X;
    B->plan->slots[slot].xwhole = device_whole;
  }
  if (cut >= 0 || fsdp) {
    st_slot* sl = &B->plan->slots[slot];
    sl->logical = p->type;
    memset(&sl->sharding, 0, sizeof(sl->sharding));
    if (cut >= 0) sl->sharding.split[cut] |= ST_PLAN_AXIS_TENSOR;
    if (fsdp) sl->sharding.split[0] |= ST_PLAN_AXIS_FSDP;
    if (fsdp && cut == 0) sl->sharding.outer[0] = ST_PLAN_AXIS_TENSOR;
    if (cat == ST_SLOT_GRAD && B->data > 1) sl->sharding.partial = ST_PLAN_AXIS_DATA;
  }
  return slot;
}

/* A per-device tensor of parameter |param| under FSDP, whole but for the
 * tensor cut (st__tensor_local): its gathered value ("full:",
 * ST_SLOT_GATHERED) or a gradient before its reduce-scatter ("ugrad:",
 * "hgrad:", ST_SLOT_UNREDUCED). */
static int st__whole(st__builder* B, const char* prefix, int param, st_slot_category cat) {
  const st_bundle_param* p = &B->bundle->params[param];
  char name[256];
  snprintf(name, sizeof(name), "%s%s", prefix, p->name);
  int cut = -1;
  st_tensor_type t = st__tensor_local(B, param, &cut);
  /* A pipeline's tied head gradient is one microbatch's, sent between
   * stages (as st__pslot's "hgrad:"); the rest lie on their parameter's stage. */
  const bool per_micro = B->P > 1 && !strcmp(prefix, "hgrad:");
  return st__slot(B, name, cat, &t, false, !per_micro, per_micro ? B->stage : B->param_stage[param]);
}

/* The slot a compute launch reads parameter |param| from. */
static int st__param_in(st__builder* B, int param) {
  if (st__fsdp(B)) return st__whole(B, "full:", param, ST_SLOT_GATHERED);
  return st__pslot(B, "", param, ST_SLOT_PARAM, true);
}

/* The slot a backward launch writes parameter |param|'s gradient to:
 * "grad:" (first microbatch) or "gtmp:" (later ones, to be accumulated),
 * or under FSDP the whole "ugrad:" that the reduce-scatter then cuts into
 * one of those. */
static int st__grad_out(st__builder* B, const char* gp, int param) {
  if (st__fsdp(B)) return st__whole(B, "ugrad:", param, ST_SLOT_UNREDUCED);
  return st__pslot(B, gp, param, ST_SLOT_GRAD, false);
}

static int st__act(st__builder* B, const char* name, const st_tensor_type* t) {
  return st__slot(B, name, ST_SLOT_ACT, t, false, false, B->stage);
}

static int st__xfer(st__builder* B, const char* name, const st_tensor_type* t) {
  return st__slot(B, name, ST_SLOT_XFER, t, false, false, B->stage);
}

/* A program of the current stage (an SPMD program is compiled per stage). */
static int st__program(st__builder* B, const char* name) { return st_plan_program_at(B->plan, name, B->stage); }

static void st__plan_launch(st__builder* B, st_op_kind kind, const st_bundle_program* p, int layer, int micro, int n_in,
                       const int* in, int n_out, const int* out) {
  st_plan_add(B->plan, kind, st__program(B, p->name), layer, micro, 0, n_in, in, n_out, out);
}

/* diag.numerics=layer: act_stats of slot |x| (a block's output or input
 * gradient), read before the clip (st__read_norms_and_clip). */
static void st__act_stats(st__builder* B, const st_bundle_program* p, int x, int tag, int layer, int micro) {
  if (B->numerics < ST_NUMERICS_LAYER || !p) return;
  char name[160];
  snprintf(name, sizeof(name), "nstat.%s[%d][%d]", tag == ST_TAG_NUM_OUT ? "out" : "dx", micro, layer);
  int s = st__xfer(B, name, &p->outputs[0].type);
  st__plan_launch(B, ST_OP_LAUNCH, p, layer, micro, 1, &x, 1, &s);
  if (B->n_astat == B->cap_astat) {
    B->cap_astat = B->cap_astat ? 2 * B->cap_astat : 16;
    B->astat = st_xrealloc(B->astat, (size_t)B->cap_astat * 4 * sizeof(int));
  }
  int* a = B->astat + 4 * B->n_astat++;
  a[0] = s;
  a[1] = tag;
  a[2] = layer;
  a[3] = micro;
}

/*===-------------------------------------------------------------------===*/
/* Optimizer state: the update program's state inputs                       */
/*===-------------------------------------------------------------------===*/

/* The plan knows no optimizer: a group's update program takes its params
 * (n), grads (n), then its state tensors, then step, lr, gscale and hyper,
 * and returns the params and the state in the same order (docs/scheduling.md,
 * "Optimizer state"). A state input of role "opt_<kind>" named
 * "<kind>_<local>" is the state of the group's parameter <local>, kept in
 * the persistent slot "<kind>:<parameter>" (AdamW's "m:", "v:"). */
static const st_bundle_program* st__update_program(const st__builder* B, const st__instance* I) {
  return st__fsdp(B) ? I->group->shard_update : I->group->update;
}

/* State input |j| (program input 2n + j) of |p|: its kind into |kind| and
 * the index of its parameter in the group (-1: not a state input). */
static int st__opt_input(const st_bundle_program* p, const st_bundle_group* g, int j, char* kind, size_t size) {
  const st_bundle_tensor* in = &p->inputs[2 * g->param_count + j];
  if (strncmp(in->role, "opt_", 4) != 0) return -1;
  const char* k = in->role + 4;
  const size_t nk = strlen(k);
  if (nk == 0 || nk >= size || strncmp(in->name, k, nk) != 0 || in->name[nk] != '_') return -1;
  for (size_t c = 0; c < nk; ++c)
    if (!((k[c] >= 'a' && k[c] <= 'z') || (k[c] >= '0' && k[c] <= '9'))) return -1;
  snprintf(kind, size, "%s", k);
  for (int q = 0; q < g->param_count; ++q)
    if (!strcmp(g->params[q], in->name + nk + 1)) return q;
  return -1;
}

/* The slot of state input |j| of instance |I|'s update. A state of its
 * parameter's type (AdamW's m and v, Muon's momentum) is cut as the
 * parameter (st__pslot: tensor and fsdp blocks); another (Adafactor's
 * factored rows and columns) is the input's type, whole and replicated on
 * every device (on a sharded mesh only an SPMD update, which gathers the
 * parameter, may declare one: st__check_update). */
static int st__opt_slot(st__builder* B, const st__instance* I, int j) {
  const st_bundle_program* p = st__update_program(B, I);
  char kind[32], prefix[40], name[320];
  const int q = st__opt_input(p, I->group, j, kind, sizeof(kind));
  const int param = I->params[q];
  const st_bundle_tensor* in = &p->inputs[2 * I->count + j];
  snprintf(prefix, sizeof(prefix), "%s:", kind);
  if (st__plan_same_type(&in->type, &p->inputs[q].type)) return st__pslot(B, prefix, param, ST_SLOT_OPT, true);
  snprintf(name, sizeof(name), "%s%s", prefix, B->bundle->params[param].name);
  return st__slot(B, name, ST_SLOT_OPT, &in->type, true, true, B->param_stage[param]);
}

/* The number of state inputs of |p| for a group of |n| parameters. */
static int st__opt_count(const st_bundle_program* p, int n) { return p->input_count - 2 * n - 4; }

/* An update program fits the plan's reading of it (above): every input
 * between the gradients and the four scalars a parameter's state, returned
 * in order after the parameters (then the statistics, |stats|). A state
 * whose type is not its parameter's needs the parameter whole: on a
 * sharded mesh (|sharded|) a one-device update may have one only for a
 * parameter it takes whole (as the group's one-device update does: the
 * embedding under tensor parallelism); for a cut one only an SPMD update
 * (manifest spmd_programs), which gathers it. */
static st_status st__check_update(const st_bundle* b, const st_bundle_group* g, const st_bundle_program* p, bool stats,
                                  bool sharded) {
  const int n = g->param_count, S = p ? st__opt_count(p, n) : 0;
  if (!p) return ST_OK;
  if (S < 0 || 2 * n + S + 4 > ST__MAX_IO || p->output_count != n + S + (stats ? 1 : 0))
    return st_status_make(ST_CODE_RUNTIME,
                          "bundle %s: group '%s''s update '%s' does not take params, grads, state, step, lr, gscale, "
                          "hyper and return params, state%s (at most %d inputs; docs/scheduling.md, \"Optimizer state\")",
                          b->dir, g->name, p->name, stats ? ", stats" : "", ST__MAX_IO);
  for (int j = 0; j < S; ++j) {
    char kind[32];
    const st_bundle_tensor* in = &p->inputs[2 * n + j];
    const int q = st__opt_input(p, g, j, kind, sizeof(kind));
    if (q < 0)
      return st_status_make(ST_CODE_RUNTIME,
                            "bundle %s: group '%s''s update '%s': input '%s' (role '%s') is not a parameter's state: role "
                            "opt_<kind>, name <kind>_<parameter> (docs/scheduling.md, \"Optimizer state\")",
                            b->dir, g->name, p->name, in->name, in->role);
    if (!st__plan_same_type(&in->type, &p->outputs[n + j].type) ||
        (sharded && !st__plan_same_type(&in->type, &p->inputs[q].type) && !st_bundle_collective_find(b, p->name) &&
         !st__plan_same_type(&p->inputs[q].type, &g->update->inputs[q].type)))
      return st_status_make(ST_CODE_RUNTIME,
                            "bundle %s: group '%s''s update '%s': state '%s' is not returned with its type, or is not its "
                            "parameter's shape in a one-device update on a sharded mesh (such a state needs an SPMD update that "
                            "gathers its parameter)",
                            b->dir, g->name, p->name, in->name);
  }
  return ST_OK;
}

static st_status st__check_updates(const st_bundle* b, bool fsdp, bool sharded) {
  for (int i = 0; i < b->group_count; ++i) {
    const st_bundle_group* g = &b->groups[i];
    ST_RETURN(st__check_update(b, g, fsdp ? g->shard_update : g->update, false, sharded));
    if (!fsdp) ST_RETURN(st__check_update(b, g, g->update_stats, true, sharded));
  }
  return ST_OK;
}

int64_t st_plan_layer_state_bytes(const st_bundle* b, int layer) {
  const st_bundle_group* g = b->layers[layer].group;
  const st_bundle_program* p = g->update;
  int64_t bytes = 0;
  char kind[32];
  for (int j = 0; j < st__opt_count(p, g->param_count); ++j) {
    const int q = st__opt_input(p, g, j, kind, sizeof(kind));
    const int param = q < 0 ? -1 : st_bundle_param_of(b, g->name, layer, g->params[q]);
    const st_tensor_type* t = &p->inputs[2 * g->param_count + j].type;
    if (param >= 0 && st__plan_same_type(t, &p->inputs[q].type)) t = &b->params[param].type;
    bytes += st_tensor_type_bytes(t);
  }
  return bytes;
}

/* Parameters (and with |optimizer|, their optimizer state) first, so slot
 * numbering is stable and readable: each parameter's state follows the
 * kinds' order in its group's update (m, v for AdamW). */
static void st__state_slots(st__builder* B, bool optimizer) {
  for (int i = 0; i < B->n_inst; ++i)
    for (int k = 0; k < B->inst[i].count; ++k) st__pslot(B, "", B->inst[i].params[k], ST_SLOT_PARAM, true);
  if (!optimizer) return;
  for (int i = 0; i < B->n_inst; ++i) {
    const st__instance* I = &B->inst[i];
    const st_bundle_program* p = st__update_program(B, I);
    const int S = st__opt_count(p, I->count);
    char kind[32];
    for (int k = 0; k < I->count; ++k)
      for (int j = 0; j < S; ++j)
        if (st__opt_input(p, I->group, j, kind, sizeof(kind)) == k) st__opt_slot(B, I, j);
  }
}

/*===-------------------------------------------------------------------===*/
/* FSDP: parameter all-gathers around their uses                            */
/*===-------------------------------------------------------------------===*/

static void st__use_add(st__builder* B, int i, int j, bool forward, int micro) {
  B->uses = st_xrealloc(B->uses, (size_t)(B->n_uses + 1) * sizeof(st__use));
  st__use* u = &B->uses[B->n_uses++];
  u->inst[0] = i;
  u->inst[1] = j;
  u->n = j >= 0 ? 2 : 1;
  u->forward = forward;
  u->micro = micro;
}

/* The parameter uses of |M| microbatches, in the order st__forward and
 * st__backward (or, with |eval|, st__evaluation) emit their launches. */
static void st__plan_uses(st__builder* B, int M, bool eval) {
  const int H = B->n_inst - 1, tied_with = B->tied ? 0 : -1;
  B->n_uses = B->use_pos = 0;
  for (int m = 0; m < M; ++m) {
    for (int i = 0; i <= B->L; ++i) st__use_add(B, i, -1, true, m); /* embed, blocks */
    st__use_add(B, H, tied_with, eval, m);                             /* head (its loss starts the backward) */
    if (eval) continue;
    for (int l = B->L - 1; l >= 0; --l) st__use_add(B, 1 + l, -1, false, m);
    st__use_add(B, 0, -1, false, m);
  }
}

/* A pipeline's parameter uses, in the order its tasks emit their launches
 * (st__chunk_forward, st__chunk_backward, st__pipeline_evaluation); the
 * head reads the tied wte from its copy (st__wte_copy), not a gather. */
static void st__plan_uses_pipeline(st__builder* B, const st_plan_pipe_task* tasks, int n, int EM) {
  const int H = B->n_inst - 1;
  B->n_uses = B->use_pos = 0;
  for (int k = 0; k < n; ++k) {
    const st_plan_pipe_task* t = &tasks[k];
    const int l0 = B->first[t->chunk], l1 = B->first[t->chunk + 1];
    if (!t->backward) {
      if (t->chunk == 0) st__use_add(B, 0, -1, true, t->micro);
      for (int l = l0; l < l1; ++l) st__use_add(B, 1 + l, -1, true, t->micro);
      continue;
    }
    if (t->chunk == B->C - 1) st__use_add(B, H, -1, false, t->micro);
    for (int l = l1 - 1; l >= l0; --l) st__use_add(B, 1 + l, -1, false, t->micro);
    if (t->chunk == 0) st__use_add(B, 0, -1, false, t->micro);
  }
  for (int m = 0; m < EM; ++m) { /* an evaluation: each microbatch through every chunk, then the head */
    st__use_add(B, 0, -1, true, m);
    for (int l = 0; l < B->L; ++l) st__use_add(B, 1 + l, -1, true, m);
    st__use_add(B, H, -1, true, m);
  }
}

static void st__gather(st__builder* B, int i, int micro) {
  const st__instance* I = &B->inst[i];
  int in[ST__MAX_GROUP_PARAMS], out[ST__MAX_GROUP_PARAMS];
  const int stage = B->stage;
  B->stage = st__inst_stage(B, i);
  for (int k = 0; k < I->count; ++k) {
    in[k] = st__pslot(B, "", I->params[k], ST_SLOT_PARAM, true);
    out[k] = st__whole(B, "full:", I->params[k], ST_SLOT_GATHERED);
  }
  if (B->X > 1) /* across processes: strata's own collective (docs/multiprocess.md) */
    st_plan_add(B->plan, ST_OP_XPROC, -1, I->layer, micro, ST_COLL_ALL_GATHER, I->count, in, I->count, out);
  else
    st_plan_add(B->plan, ST_OP_COLLECTIVE, st__program(B, I->group->fsdp_all_gather->name), I->layer, micro,
                ST_COLL_ALL_GATHER, I->count, in, I->count, out);
  B->gathered[i] = true;
  B->stage = stage;
}

/* Gathers the parameters of uses [from, to] that are not gathered yet. */
static void st__gather_uses(st__builder* B, int from, int to) {
  for (int q = from; q < B->n_uses && q <= to; ++q)
    for (int k = 0; k < B->uses[q].n; ++k)
      if (!B->gathered[B->uses[q].inst[k]]) st__gather(B, B->uses[q].inst[k], B->uses[q].micro);
}

/* Before the launches of the current use: its parameters, if no earlier
 * prefetch gathered them, and in the forward those of the next
 * sched.gather_prefetch uses, issued before this use's launches, so they
 * are in flight while it computes. In the backward the prefetch waits for
 * st__use_end: there a reduce-scatter comes right after each launch, and
 * the executor starts one SPMD op at a time (plan->serialize_spmd), so a
 * gather issued before the next launch would hold that launch until the
 * reduce-scatter is done, and the two would never overlap. */
static void st__use_begin(st__builder* B) {
  if (!st__fsdp(B)) return;
  st__gather_uses(B, B->use_pos, B->use_pos + (B->uses[B->use_pos].forward ? B->gather_prefetch : 0));
}

/* After them: each instance's gathered parameters are freed unless its
 * next use is within the prefetch window (it would be gathered again at
 * once), or, without sched.reshard_after_forward, this was a forward use
 * and the next is the same microbatch's backward. In the backward, the
 * next sched.gather_prefetch uses' parameters are gathered first (see
 * st__use_begin). */
static void st__use_end(st__builder* B) {
  if (!st__fsdp(B)) {
    B->use_pos++;
    return;
  }
  const st__use* u = &B->uses[B->use_pos];
  /* The backward's prefetch, before the FREEs: the launches still read
   * this use's buffers, so the window is this use and the next ones. */
  if (!u->forward) st__gather_uses(B, B->use_pos + 1, B->use_pos + B->gather_prefetch);
  for (int k = 0; k < u->n; ++k) {
    int i = u->inst[k], next = -1;
    for (int q = B->use_pos + 1; q < B->n_uses && next < 0; ++q)
      if (B->uses[q].inst[0] == i || (B->uses[q].n > 1 && B->uses[q].inst[1] == i)) next = q;
    bool keep = next >= 0 && (next <= B->use_pos + B->gather_prefetch ||
                              (!B->reshard && u->forward && !B->uses[next].forward && B->uses[next].micro == u->micro));
    if (keep) continue;
    const st__instance* I = &B->inst[i];
    int full[ST__MAX_GROUP_PARAMS];
    for (int j = 0; j < I->count; ++j) full[j] = st__whole(B, "full:", I->params[j], ST_SLOT_GATHERED);
    st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, u->micro, 0, I->count, full, 0, NULL);
    B->gathered[i] = false;
  }
  B->use_pos++;
}

/* FSDP: the whole gradients of instance |i| ("ugrad:") reduce-scattered
 * into their fsdp blocks, "grad:" for the first microbatch and "gtmp:"
 * (then accumulated) for later ones; the whole ones are freed. */
static void st__reduce_scatter(st__builder* B, int i, int m) {
  const st__instance* I = &B->inst[i];
  int in[ST__MAX_GROUP_PARAMS], out[ST__MAX_GROUP_PARAMS];
  const int stage = B->stage;
  B->stage = st__inst_stage(B, i);
  for (int k = 0; k < I->count; ++k) {
    in[k] = st__whole(B, "ugrad:", I->params[k], ST_SLOT_UNREDUCED);
    out[k] = st__pslot(B, m == 0 ? "grad:" : "gtmp:", I->params[k], ST_SLOT_GRAD, false);
  }
  if (B->X > 1)
    st_plan_add(B->plan, ST_OP_XPROC, -1, I->layer, m, ST_COLL_REDUCE_SCATTER, I->count, in, I->count, out);
  else
    st_plan_add(B->plan, ST_OP_COLLECTIVE, st__program(B, I->group->fsdp_reduce_scatter->name), I->layer, m,
                ST_COLL_REDUCE_SCATTER, I->count, in, I->count, out);
  st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, m, 0, I->count, in, 0, NULL);
  B->stage = stage;
}

/*===-------------------------------------------------------------------===*/
/* Forward                                                                  */
/*===-------------------------------------------------------------------===*/

/* Microbatch |m|'s batch tensors: the tokens (|tokens|), the targets and
 * the mask (|targets|), each an H2D the trainer fills. A pipeline puts the
 * tokens on the first stage and the targets and mask on the last. */
static void st__batch(st__builder* B, int m, bool eval, st__fwd_out* f, bool tokens, bool targets) {
  const st__instance* E = &B->inst[0];
  const st_bundle_program* ef = E->stage->fwd;
  char name[160];
  st_tensor_type mt = ef->inputs[E->count].type;
  mt.dtype = ST_DTYPE_F32;
  if (tokens) {
    snprintf(name, sizeof(name), "tokens[%d]", m);
    f->tokens = st__xfer(B, name, &ef->inputs[E->count].type);
  }
  if (targets) {
    snprintf(name, sizeof(name), "targets[%d]", m);
    f->targets = st__xfer(B, name, &ef->inputs[E->count].type);
    snprintf(name, sizeof(name), "mask[%d]", m);
    f->mask = st__xfer(B, name, &mt);
  }
  if (tokens)
    st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_TOKENS : ST_TAG_TOKENS, 0, NULL, 1, &f->tokens);
  if (targets) {
    st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_TARGETS : ST_TAG_TARGETS, 0, NULL, 1, &f->targets);
    st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_MASK : ST_TAG_MASK, 0, NULL, 1, &f->mask);
  }
}

/* data.packing=pack: microbatch |m|'s positions on the current stage, an
 * H2D the trainer fills at the stage's first use (the embedding, or its
 * first block). Returns -1 when the bundle takes none. */
static int st__positions(st__builder* B, int m, bool eval, st__fwd_out* f) {
  if (!B->positions) return -1;
  if (f->pos1[B->stage] > 0) return f->pos1[B->stage] - 1;
  const st_bundle_program* ef = B->inst[0].stage->fwd;
  char name[64];
  snprintf(name, sizeof(name), "positions[%d]", m);
  int p = st__xfer(B, name, &ef->inputs[ef->input_count - 1].type);
  st_plan_add(B->plan, ST_OP_H2D, -1, -1, m, eval ? ST_TAG_EVAL_POSITIONS : ST_TAG_POSITIONS, 0, NULL, 1, &p);
  f->pos1[B->stage] = p + 1;
  return p;
}

/* The positions of microbatch |m| on the current stage are used no more. */
static void st__positions_free(st__builder* B, int m, st__fwd_out* f) {
  if (f->pos1[B->stage] <= 0) return;
  int p = f->pos1[B->stage] - 1;
  st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, &p, 0, NULL);
  f->pos1[B->stage] = 0;
}

/* embed fwd(embed params, tokens) -> x[0]; the params: wte first (the
 * tied head's), then any others of the group (learned positions). */
static int st__embed_forward(st__builder* B, int m, bool eval, st__fwd_out* f) {
  const st__instance* E = &B->inst[0];
  const st_bundle_program* ef = E->stage->fwd;
  const int pos = st__positions(B, m, eval, f);
  int x = st__act(B, "x[0]", &ef->outputs[0].type);
  int in[ST__MAX_IO], n = 0;
  st__use_begin(B);
  for (int k = 0; k < E->count; ++k) in[n++] = st__param_in(B, E->params[k]);
  in[n++] = f->tokens;
  if (pos >= 0) in[n++] = pos;
  st__plan_launch(B, ST_OP_LAUNCH, ef, -1, m, n, in, 1, &x);
  st__use_end(B);
  if (eval) st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, &f->tokens, 0, NULL);
  return x;
}

/* Blocks [l0, l1) of microbatch |m| from their input |x|; returns the last
 * one's output. Layers with remat[l] (and every layer of an evaluation)
 * run their fwd program and keep only x[l]; the others run fwd_res and
 * keep their residuals for bwd_res. */
static int st__blocks_forward(st__builder* B, int m, bool eval, int l0, int l1, int x, st__fwd_out* f) {
  int in[ST__MAX_IO], out[ST__MAX_IO];
  char name[160];
  const int pos = l0 < l1 ? st__positions(B, m, eval, f) : -1;
  const int np = pos >= 0 ? 1 : 0;
  /* block fwd(params, x[l]) -> x[l+1], or fwd_res -> x[l+1], residuals */
  for (int l = l0; l < l1; ++l) {
    const st__instance* I = &B->inst[1 + l];
    const st_bundle_program* fwd = I->stage->fwd;
    const st_bundle_program* fwd_res = I->stage->fwd_res;
    st__use_begin(B);
    for (int k = 0; k < I->count; ++k) in[k] = st__param_in(B, I->params[k]);
    in[I->count] = x;
    if (np) in[I->count + 1] = pos;
    snprintf(name, sizeof(name), "x[%d]", l + 1);
    int y = st__act(B, name, &fwd->outputs[0].type);
    /* The block's metrics: read after the step (st__read_losses), or, in
     * an evaluation, dropped. */
    const int S = st_plan_metric_outputs(fwd);
    out[0] = y;
    for (int s = 0; s < S; ++s) {
      if (eval)
        snprintf(name, sizeof(name), "metric_eval.%s", fwd->outputs[1 + s].name);
      else
        snprintf(name, sizeof(name), "metric[%d][%d].%s", m, l, fwd->outputs[1 + s].name);
      out[1 + s] = st__xfer(B, name, &fwd->outputs[1 + s].type);
    }
    if (eval || B->remat[l]) {
      st__plan_launch(B, ST_OP_LAUNCH, fwd, l, m, I->count + 1 + np, in, 1 + S, out);
    } else {
      for (int r = 1 + S; r < fwd_res->output_count; ++r) {
        snprintf(name, sizeof(name), "res[%d].%s", l, fwd_res->outputs[r].name);
        out[r] = st__act(B, name, &fwd_res->outputs[r].type);
      }
      st__plan_launch(B, ST_OP_LAUNCH, fwd_res, l, m, I->count + 1 + np, in, fwd_res->output_count, out);
    }
    st__use_end(B);
    if (!eval) st__act_stats(B, I->stage->act_stats, y, ST_TAG_NUM_OUT, l, m);
    /* Evaluation keeps nothing for a backward pass. */
    if (eval && S > 0) st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, S, out + 1, 0, NULL);
    if (eval) st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, 1, &x, 0, NULL);
    x = y;
  }
  return x;
}

/* Microbatch |m| up to the last block's output, on one stage. */
static void st__forward(st__builder* B, int m, bool eval, st__fwd_out* f) {
  st__batch(B, m, eval, f, true, true);
  int x = st__embed_forward(B, m, eval, f);
  f->x = st__blocks_forward(B, m, eval, 0, B->L, x, f);
  if (eval) st__positions_free(B, m, f);
}

/*===-------------------------------------------------------------------===*/
/* Optimizer pieces                                                         */
/*===-------------------------------------------------------------------===*/

/* The group's accum(grad..., gtmp...) -> grad..., then the gtmp are freed
 * (under FSDP the fsdp-block program on the blocks). |only_param| >= 0
 * restricts it to that one parameter: the tied head's gradient of the
 * embedding ("hgrad:"), added to the whole "ugrad:" under FSDP. */
static void st__accumulate(st__builder* B, const st__instance* I, const char* tmp_prefix, int m, int only_param) {
  int in[2 * ST__MAX_GROUP_PARAMS], out[ST__MAX_GROUP_PARAMS], n = 0;
  const bool whole = st__fsdp(B) && only_param >= 0;
  for (int k = 0; k < I->count; ++k) {
    if (only_param >= 0 && I->params[k] != only_param) continue;
    in[n] = whole ? st__whole(B, "ugrad:", I->params[k], ST_SLOT_UNREDUCED) : st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
    out[n] = in[n];
    ++n;
  }
  for (int k = 0, j = 0; k < I->count; ++k) {
    if (only_param >= 0 && I->params[k] != only_param) continue;
    in[n + j++] = whole ? st__whole(B, tmp_prefix, I->params[k], ST_SLOT_UNREDUCED)
                        : st__pslot(B, tmp_prefix, I->params[k], ST_SLOT_GRAD, false);
  }
  const st_bundle_program* acc = st__fsdp(B) && !whole ? I->group->shard_accum : I->group->accum;
  /* The tied head's gradient of wte alone, in a group with more parameters */
  if (only_param >= 0 && I->stage->accum_tied) acc = I->stage->accum_tied;
  st__plan_launch(B, ST_OP_LAUNCH, acc, I->layer, m, 2 * n, in, n, out);
  st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, m, 0, n, in + n, 0, NULL);
}

/* The group's sqnorm(grads...) -> sq[i] for group instance |i|. */
static void st__sqnorm(st__builder* B, int i) {
  const st__instance* I = &B->inst[i];
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  int in[ST__MAX_GROUP_PARAMS];
  char name[160];
  B->stage = st__inst_stage(B, i);
  for (int k = 0; k < I->count; ++k) in[k] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
  snprintf(name, sizeof(name), "sq[%d]", i);
  B->sq[i] = st__xfer(B, name, &scalar);
  st__plan_launch(B, ST_OP_LAUNCH, st__fsdp(B) ? I->group->shard_sqnorm : I->group->sqnorm, I->layer, -1, I->count, in, 1, &B->sq[i]);
}

/* The group's update(params, grads, state..., step, lr, gscale, hyper) ->
 * params, state for group instance |i|; then its gradients are freed. */
static void st__update(st__builder* B, int i) {
  const st__instance* I = &B->inst[i];
  int in[ST__MAX_IO], out[ST__MAX_IO];
  int n = 0, no = 0;
  const st_bundle_program* up = st__update_program(B, I);
  const int S = st__opt_count(up, I->count); /* st__check_update bounded it */
  B->stage = st__inst_stage(B, i);
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "", I->params[k], ST_SLOT_PARAM, true);
  for (int k = 0; k < I->count; ++k) in[n++] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
  for (int j = 0; j < S; ++j) in[n++] = st__opt_slot(B, I, j);
  for (int j = 0; j < 4; ++j) in[n++] = B->sc[B->stage][j];
  for (int k = 0; k < I->count; ++k) out[no++] = in[k];
  for (int j = 0; j < S; ++j) out[no++] = in[2 * I->count + j];
  const st_bundle_program* stats = B->numerics && !st__fsdp(B) ? I->group->update_stats : NULL;
  if (stats) {
    /* diag.numerics: the same update, and the group's statistics */
    char name[160];
    snprintf(name, sizeof(name), "nstat.opt[%d]", i);
    B->nstat[i] = out[no++] = st__xfer(B, name, &stats->outputs[stats->output_count - 1].type);
    st__plan_launch(B, ST_OP_LAUNCH, stats, I->layer, -1, n, in, no, out);
    st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, -1, 0, I->count, in + I->count, 0, NULL);
    return;
  }
  st__plan_launch(B, ST_OP_LAUNCH, up, I->layer, -1, n, in, no, out);
  st_plan_add(B->plan, ST_OP_FREE, -1, I->layer, -1, 0, I->count, in + I->count, 0, NULL);
}

/* The four optimizer scalars, filled by the trainer once lr and gscale are
 * known: on every stage of a pipeline. */
static void st__scalars(st__builder* B) {
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  const st_tensor_type hyper = {ST_DTYPE_F32, 1, {4}};
  for (B->stage = 0; B->stage < B->P; ++B->stage) {
    int* sc = B->sc[B->stage];
    sc[0] = st__xfer(B, "step", &scalar);
    sc[1] = st__xfer(B, "lr", &scalar);
    sc[2] = st__xfer(B, "gscale", &scalar);
    sc[3] = st__xfer(B, "hyper", &hyper);
    const int tags[4] = {ST_TAG_STEP, ST_TAG_LR, ST_TAG_GSCALE, ST_TAG_HYPER};
    for (int j = 0; j < 4; ++j) st_plan_add(B->plan, ST_OP_H2D, -1, -1, -1, tags[j], 0, NULL, 1, &sc[j]);
  }
  B->stage = 0;
}

static void st__free_scalars(st__builder* B) {
  for (int st = 0; st < B->P; ++st) st_plan_add(B->plan, ST_OP_FREE, -1, -1, -1, 0, 4, B->sc[st], 0, NULL);
}

/* READ every squared norm, then the host's clip scale and learning rate. */
static void st__read_norms_and_clip(st__builder* B) {
  for (int k = 0; k < B->n_astat; ++k) {
    const int* a = B->astat + 4 * k;
    st_plan_add(B->plan, ST_OP_READ, -1, a[2], a[3], a[1], 1, &a[0], 0, NULL);
    st_plan_add(B->plan, ST_OP_FREE, -1, a[2], a[3], 0, 1, &a[0], 0, NULL);
  }
  B->n_astat = 0;
  for (int i = 0; i < B->n_inst; ++i) {
    st_plan_add(B->plan, ST_OP_READ, -1, B->inst[i].layer, i, ST_TAG_SQNORM, 1, &B->sq[i], 0, NULL);
    st_plan_add(B->plan, ST_OP_FREE, -1, B->inst[i].layer, i, 0, 1, &B->sq[i], 0, NULL);
  }
  st_plan_add(B->plan, ST_OP_HOST, -1, -1, -1, ST_TAG_CLIP, 0, NULL, 0, NULL);
}

/*===-------------------------------------------------------------------===*/
/* Optimizer placement (sched.optimizer): the one choice point              */
/*===-------------------------------------------------------------------===*/

/* Where the optimizer enters the step. The backward calls |grad_final|
 * when a group instance's gradient is final (its last microbatch's
 * accumulation is done); the step calls |before_last_backward| after the
 * last microbatch's forward and |finish| after the losses are read. */
typedef struct {
  void (*before_last_backward)(st__builder* B);
  void (*grad_final)(st__builder* B, int instance);
  void (*finish)(st__builder* B);
} st__optimizer;

static void st__nothing(st__builder* B) { (void)B; }
static void st__nothing_i(st__builder* B, int i) {
  (void)B;
  (void)i;
}

/* after_backward: every gradient is final once the backward is done. All
 * norms are launched before the first read (one wait, not n_inst), the
 * host clips, then AdamW updates every group instance. */
/* diag.numerics: READ each instance's update_stats (after its update). */
static void st__read_update_stats(st__builder* B) {
  for (int i = 0; i < B->n_inst; ++i) {
    if (B->nstat[i] < 0) continue;
    st_plan_add(B->plan, ST_OP_READ, -1, B->inst[i].layer, i, ST_TAG_NUM_OPT, 1, &B->nstat[i], 0, NULL);
    st_plan_add(B->plan, ST_OP_FREE, -1, B->inst[i].layer, i, 0, 1, &B->nstat[i], 0, NULL);
    B->nstat[i] = -1;
  }
}

static void st__after_backward_finish(st__builder* B) {
  for (int i = 0; i < B->n_inst; ++i) st__sqnorm(B, i);
  st__read_norms_and_clip(B);
  st__scalars(B);
  for (int i = 0; i < B->n_inst; ++i) st__update(B, i);
  st__read_update_stats(B);
  st__free_scalars(B);
}

static const st__optimizer st__after_backward = {st__nothing, st__nothing_i, st__after_backward_finish};

/* per_layer: no clipping (train.grad_clip = 0), so lr and gscale are known
 * before any gradient, and each instance is updated as soon as its
 * gradient is final, while the backward goes on. The norms are still read
 * for the reported grad_norm. */
static void st__per_layer_before(st__builder* B) {
  st_plan_add(B->plan, ST_OP_HOST, -1, -1, -1, ST_TAG_SCHEDULE, 0, NULL, 0, NULL);
  st__scalars(B);
}

static void st__per_layer_grad_final(st__builder* B, int i) {
  st__sqnorm(B, i);
  st__update(B, i);
}

static void st__per_layer_finish(st__builder* B) {
  st__read_norms_and_clip(B);
  st__read_update_stats(B);
  st__free_scalars(B);
}

static const st__optimizer st__per_layer = {st__per_layer_before, st__per_layer_grad_final, st__per_layer_finish};

/*===-------------------------------------------------------------------===*/
/* Gradient reduction (parallel.data > 1, sched.grad_reduce)                */
/*===-------------------------------------------------------------------===*/

/* The group's data all-reduce on instance |i|'s gradients, in place: over
 * this process's devices (an XLA program), then over the processes (an
 * XPROC op on each device's reduced copy; docs/multiprocess.md). */
static void st__reduce(st__builder* B, int i) {
  const st__instance* I = &B->inst[i];
  const int stage = B->stage;
  B->stage = st__inst_stage(B, i);
  int g[ST__MAX_GROUP_PARAMS];
  for (int k = 0; k < I->count; ++k) g[k] = st__pslot(B, "grad:", I->params[k], ST_SLOT_GRAD, false);
  if (B->data > 1)
    st_plan_add(B->plan, ST_OP_COLLECTIVE, st__program(B, I->group->data_all_reduce->name), I->layer, -1,
                ST_COLL_ALL_REDUCE, I->count, g, I->count, g);
  if (B->xdata > 1) st_plan_add(B->plan, ST_OP_XPROC, -1, I->layer, -1, ST_COLL_ALL_REDUCE, I->count, g, I->count, g);
  B->stage = stage;
}

static void st__flush_reductions(st__builder* B) {
  for (int k = 0; k < B->n_pending; ++k) st__reduce(B, B->pending[k]);
  B->n_pending = 0;
  B->pending_bytes = 0;
}

/* One device's gradient bytes of instance |i| (its fsdp blocks under FSDP). */
static int64_t st__instance_bytes(const st__builder* B, int i) {
  int64_t n = 0;
  for (int k = 0; k < B->inst[i].count; ++k) {
    st_tensor_type t = B->bundle->params[B->inst[i].params[k]].type;
    const int blocks = B->F * B->X;
    if (blocks > 1 && t.rank > 0) t.dims[0] = (t.dims[0] + blocks - 1) / blocks;
    n += (int64_t)st_tensor_type_bytes(&t);
  }
  return n;
}

/* Instance |i|'s gradient is final (its last microbatch is accumulated).
 * per_layer: its all-reduce goes right here, so it runs while the next
 * layer's backward does; bucketed: it joins the bucket, which is issued
 * once it holds sched.grad_bucket_bytes (the rest after the backward).
 * Then the optimizer hears of it (per_layer updates need the reduced
 * gradient, so sched.optimizer=per_layer takes grad_reduce=per_layer). */
static void st__grad_final(st__builder* B, const st__optimizer* opt, int i) {
  if (B->data > 1 || B->xdata > 1) {
    if (!B->bucketed) {
      st__reduce(B, i);
    } else {
      B->pending[B->n_pending++] = i;
      B->pending_bytes += st__instance_bytes(B, i);
      if (B->bucket_bytes > 0 && B->pending_bytes >= B->bucket_bytes) st__flush_reductions(B);
    }
  }
  opt->grad_final(B, i);
}

/*===-------------------------------------------------------------------===*/
/* Backward                                                                 */
/*===-------------------------------------------------------------------===*/

/* FSDP: what follows instance |i|'s reduce-scatter in microbatch |m|: the
 * accumulation into its first microbatch's blocks, and on the |last| one
 * its gradient is final. The backward issues this only after the next
 * layer's launches: a launch waiting for the reduce-scatter would hold that
 * device's queue, and the next layer's backward behind it, until the
 * reduce-scatter is done, and the two would not overlap. */
static void st__after_scatter(st__builder* B, const st__optimizer* opt, int i, int m, bool last) {
  if (i < 0) return;
  if (m > 0) st__accumulate(B, &B->inst[i], "gtmp:", m, -1);
  if (last) st__grad_final(B, opt, i);
}

/* The inputs of the head's loss and eval programs into |in|: its
 * parameters, [wte] (a pipeline's copy on the head's stage), x, targets,
 * mask. Returns how many. */
static int st__head_inputs(st__builder* B, const st__fwd_out* f, int* in) {
  const st__instance* E = &B->inst[0];
  const st__instance* H = &B->inst[B->n_inst - 1];
  int n = 0;
  for (int k = 0; k < H->count; ++k) in[n++] = st__param_in(B, H->params[k]);
  if (B->tied) in[n++] = B->wte_copy >= 0 ? B->wte_copy : st__param_in(B, E->params[0]);
  in[n++] = f->x;
  in[n++] = f->targets;
  in[n++] = f->mask;
  return n;
}

/* The head's loss(head params, [wte], x, targets, mask) -> loss, head
 * grads, [dwte], dx for microbatch |m|: the backward's start. Returns dx.
 * |pending|: FSDP's reduce-scatter in flight (st__after_scatter). */
static int st__head_backward(st__builder* B, const st__optimizer* opt, int m, bool last, const st__fwd_out* f,
                             int* pending) {
  const st__instance* E = &B->inst[0];
  const st__instance* H = &B->inst[B->n_inst - 1];
  const st_bundle_program* hl = H->stage->loss;
  const char* gp = m == 0 ? "grad:" : "gtmp:";
  char name[160];
  int in[ST__MAX_IO], out[ST__MAX_IO];
  int no = 0;
  st__use_begin(B);
  const int n = st__head_inputs(B, f, in);
  snprintf(name, sizeof(name), "loss[%d]", m);
  out[no++] = st__xfer(B, name, &hl->outputs[0].type);
  for (int k = 0; k < H->count; ++k) out[no++] = st__grad_out(B, gp, H->params[k]);
  if (B->tied)
    out[no++] = st__fsdp(B) ? st__whole(B, "hgrad:", E->params[0], ST_SLOT_UNREDUCED)
                         : st__pslot(B, "hgrad:", E->params[0], ST_SLOT_GRAD, false);
  int dx = st__act(B, "dx", &hl->outputs[hl->output_count - 1].type);
  out[no++] = dx;
  st__plan_launch(B, ST_OP_LAUNCH, hl, -1, m, n, in, no, out);
  st__use_end(B);
  int freed[3] = {f->x, f->targets, f->mask};
  st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 3, freed, 0, NULL);
  if (B->P > 1 && B->tied) { /* the tied gradient goes to the embedding's stage at once */
    const int here = B->stage, hg = out[1 + H->count];
    B->stage = 0;
    int to = st__fsdp(B) ? st__whole(B, "hgrad:", E->params[0], ST_SLOT_UNREDUCED)
                         : st__pslot(B, "hgrad:", E->params[0], ST_SLOT_GRAD, false);
    B->stage = here;
    st_plan_add(B->plan, ST_OP_SEND, -1, -1, m, 0, 1, &hg, 1, &to);
    st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, &hg, 0, NULL);
  }
  *pending = -1;
  if (st__fsdp(B)) {
    st__reduce_scatter(B, B->n_inst - 1, m);
    *pending = B->n_inst - 1;
  } else {
    if (m > 0) st__accumulate(B, H, "gtmp:", m, -1);
    if (last) st__grad_final(B, opt, B->n_inst - 1);
  }
  return dx;
}

/* Blocks l1-1 .. l0 of microbatch |m| in reverse from the gradient |dx|
 * of block l1-1's output: bwd_res(params, x, residuals, dy) -> grads...,
 * dx. A remat layer first recomputes its residuals with fwd_res. Returns
 * the gradient of block l0's input. */
static int st__blocks_backward(st__builder* B, const st__optimizer* opt, int m, bool last, int l0, int l1, int dx,
                               int* pending, st__fwd_out* f) {
  const char* gp = m == 0 ? "grad:" : "gtmp:";
  char name[160];
  int in[ST__MAX_IO], out[ST__MAX_IO];
  const int pos = l0 < l1 ? st__positions(B, m, false, f) : -1;
  for (int l = l1 - 1; l >= l0; --l) {
    const st__instance* I = &B->inst[1 + l];
    const st_bundle_program* fr = I->stage->fwd_res;
    const int S = st_plan_metric_outputs(fr), R = fr->output_count - 1 - S;
    snprintf(name, sizeof(name), "x[%d]", l);
    int xl = st__act(B, name, &fr->inputs[I->count].type);
    int res[ST__MAX_RESIDUALS];
    for (int r = 0; r < R; ++r) {
      snprintf(name, sizeof(name), "res[%d].%s", l, fr->outputs[1 + S + r].name);
      res[r] = st__act(B, name, &fr->outputs[1 + S + r].type);
    }
    int n = 0;
    st__use_begin(B);
    for (int k = 0; k < I->count; ++k) in[n++] = st__param_in(B, I->params[k]);
    in[n++] = xl;
    if (pos >= 0) in[n++] = pos;
    if (B->remat[l]) {
      /* y and the metrics again: the forward's were kept and read */
      out[0] = st__act(B, "y_re", &fr->outputs[0].type);
      for (int s = 0; s < S; ++s) {
        snprintf(name, sizeof(name), "metric_re.%s", fr->outputs[1 + s].name);
        out[1 + s] = st__xfer(B, name, &fr->outputs[1 + s].type);
      }
      for (int r = 0; r < R; ++r) out[1 + S + r] = res[r];
      st__plan_launch(B, ST_OP_RECOMPUTE, fr, l, m, n, in, 1 + S + R, out);
      st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, 1 + S, out, 0, NULL);
    }
    for (int r = 0; r < R; ++r) in[n++] = res[r];
    in[n++] = dx;
    int no = 0;
    for (int k = 0; k < I->count; ++k) out[no++] = st__grad_out(B, gp, I->params[k]);
    out[no++] = dx;
    st__plan_launch(B, ST_OP_LAUNCH, I->stage->bwd_res, l, m, n, in, no, out);
    st__use_end(B);
    st__act_stats(B, I->stage->act_stats, dx, ST_TAG_NUM_DX, l, m);
    int dead[1 + ST__MAX_RESIDUALS];
    dead[0] = xl;
    for (int r = 0; r < R; ++r) dead[1 + r] = res[r];
    st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, 1 + R, dead, 0, NULL);
    if (st__fsdp(B)) {
      st__after_scatter(B, opt, *pending, m, last);
      st__reduce_scatter(B, 1 + l, m);
      *pending = 1 + l;
    } else {
      if (m > 0) st__accumulate(B, I, "gtmp:", m, -1);
      if (last) st__grad_final(B, opt, 1 + l);
    }
  }
  return dx;
}

/* embed bwd(embed params, tokens, dx) -> their grads; a tied head's dwte
 * joins wte's (under FSDP before the reduce-scatter, while both are whole). */
static void st__embed_backward(st__builder* B, const st__optimizer* opt, int m, bool last, st__fwd_out* f, int dx,
                               int* pending) {
  const st__instance* E = &B->inst[0];
  const char* gp = m == 0 ? "grad:" : "gtmp:";
  int in[ST__MAX_IO], out[ST__MAX_IO], n = 0;
  const int pos = st__positions(B, m, false, f);
  st__use_begin(B);
  for (int k = 0; k < E->count; ++k) {
    in[n++] = st__param_in(B, E->params[k]);
    out[k] = st__grad_out(B, gp, E->params[k]);
  }
  in[n++] = f->tokens;
  if (pos >= 0) in[n++] = pos;
  in[n++] = dx;
  st__plan_launch(B, ST_OP_LAUNCH, E->stage->bwd, -1, m, n, in, E->count, out);
  st__use_end(B);
  int freed2[2] = {dx, f->tokens};
  st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 2, freed2, 0, NULL);
  st__positions_free(B, m, f);
  if (st__fsdp(B)) {
    st__after_scatter(B, opt, *pending, m, last);
    if (B->tied) st__accumulate(B, E, "hgrad:", m, E->params[0]);
    st__reduce_scatter(B, 0, m);
    st__after_scatter(B, opt, 0, m, last);
    return;
  }
  if (m > 0) st__accumulate(B, E, "gtmp:", m, -1);
  if (B->tied) st__accumulate(B, E, "hgrad:", m, E->params[0]);
  if (last) st__grad_final(B, opt, 0);
}

/* Microbatch |m|'s backward from the forward's |f|. The first microbatch
 * writes the gradients ("grad:"), later ones write "gtmp:" and accumulate.
 * Under FSDP each launch writes whole gradients ("ugrad:") that are
 * reduce-scattered into those blocks at once (st__reduce_scatter), so a
 * whole gradient lives only from its backward to its reduce-scatter.
 * On the |last| microbatch every instance's gradient becomes final in turn:
 * head, blocks L-1..0, embedding, and |opt| hears of each. */
static void st__backward(st__builder* B, const st__optimizer* opt, int m, bool last, st__fwd_out* f) {
  int pending = -1; /* FSDP: the instance whose reduce-scatter is in flight (st__after_scatter) */
  int dx = st__head_backward(B, opt, m, last, f, &pending);
  dx = st__blocks_backward(B, opt, m, last, 0, B->L, dx, &pending, f);
  st__embed_backward(B, opt, m, last, f, dx, &pending);
}

/* READ every microbatch's loss. */
/* The slot |name| that microbatch |m|'s ops made on |stage| (st__qualify). */
static int st__find_slot(st__builder* B, const char* name, int stage, int m) {
  char q[320];
  const int s0 = B->stage, m0 = B->micro;
  B->stage = stage;
  B->micro = m;
  st__qualify(B, name, false, q, sizeof(q));
  B->stage = s0;
  B->micro = m0;
  return st_plan_slot_find(B->plan, q);
}

static void st__read_losses(st__builder* B, int M) {
  char name[160];
  for (int m = 0; m < M; ++m) {
    snprintf(name, sizeof(name), "loss[%d]", m);
    int ls = st__find_slot(B, name, B->P - 1, m);
    st_plan_add(B->plan, ST_OP_READ, -1, -1, m, ST_TAG_LOSS, 1, &ls, 0, NULL);
    st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, &ls, 0, NULL);
  }
  /* The blocks' metrics, after the losses: reading them earlier would
   * hold the host at each block's forward. */
  for (int m = 0; m < M; ++m)
    for (int l = 0; l < B->L; ++l) {
      const st_bundle_program* f = B->inst[1 + l].stage->fwd;
      for (int s = 0; s < st_plan_metric_outputs(f); ++s) {
        snprintf(name, sizeof(name), "metric[%d][%d].%s", m, l, f->outputs[1 + s].name);
        int slot = st__find_slot(B, name, st__inst_stage(B, 1 + l), m);
        int tag = ST_TAG_METRIC + st__metric_index(B->bundle, f->outputs[1 + s].name);
        st_plan_add(B->plan, ST_OP_READ, -1, l, m, tag, 1, &slot, 0, NULL);
        st_plan_add(B->plan, ST_OP_FREE, -1, l, m, 0, 1, &slot, 0, NULL);
      }
    }
}

/*===-------------------------------------------------------------------===*/
/* Pipeline parallelism (parallel.pipeline > 1)                             */
/*===-------------------------------------------------------------------===*/

static void st__head_eval(st__builder* B, int m, const st__fwd_out* f); /* Evaluation, below */

static double st__flops(const st_bundle_program* p) { return p && p->flops > 0 ? p->flops : 0; }

/* Each layer's forward and backward cost (the manifest's FLOPs; 1 and 2
 * per layer when it has none), the embedding's (forward, backward) and the
 * head's loss (its forward and backward: it runs in the last chunk's
 * backward task). A remat layer's backward recomputes its forward. */
static void st__layer_costs(const st_bundle* b, const bool* remat, double* fwd, double* bwd, double* embed_fwd,
                            double* embed_bwd, double* head) {
  const int L = b->layer_count;
  bool known = true;
  for (int l = 0; l < L; ++l) known = known && st__flops(b->layers[l].fwd_res) > 0 && st__flops(b->layers[l].bwd_res) > 0;
  for (int l = 0; l < L; ++l) {
    const bool re = remat && remat[l];
    const double fr = known ? st__flops(b->layers[l].fwd_res) : 1, f = known ? st__flops(b->layers[l].fwd) : 1;
    fwd[l] = re ? f : fr;
    bwd[l] = (known ? st__flops(b->layers[l].bwd_res) : 2) + (re ? fr : 0);
  }
  *embed_fwd = known ? st__flops(b->embed.fwd) : 0;
  *embed_bwd = known ? st__flops(b->embed.bwd) : 0;
  *head = known ? st__flops(b->head.loss) : 0;
}

st_status st_plan_pipeline_layout(const st_bundle* b, const st_plan_options* o, const bool* remat, int* first,
                                  double* fwd, double* bwd) {
  const int P = o->parallel_pipeline, L = b->layer_count;
  const int V = o->sched.pipeline_schedule == ST_PLAN_PIPE_INTERLEAVED ? o->sched.pipeline_virtual : 1, C = P * V;
  if (C > L)
    return st_status_make(ST_CODE_CONFIG, "parallel.pipeline x sched.pipeline_virtual = %d chunks for %d layers: every "
                          "chunk needs a layer", C, L);
  double* lf = st_xcalloc((size_t)L + 1, sizeof(double));
  double* lb = st_xcalloc((size_t)L + 1, sizeof(double));
  double ef, eb, head;
  st__layer_costs(b, remat, lf, lb, &ef, &eb, &head);
  if (o->pipeline_layers) {
    first[0] = 0;
    for (int c = 0; c < C; ++c) first[c + 1] = first[c] + o->pipeline_layers[c];
  } else {
    double* cost = st_xcalloc((size_t)L + 1, sizeof(double));
    for (int l = 0; l < L; ++l) cost[l] = lf[l] + lb[l];
    st_pipe_balance(L, C, cost, ef + eb, head, first);
    free(cost);
  }
  for (int c = 0; c < C; ++c) {
    fwd[c] = c == 0 ? ef : 0;
    bwd[c] = (c == 0 ? eb : 0) + (c == C - 1 ? head : 0);
    for (int l = first[c]; l < first[c + 1]; ++l) fwd[c] += lf[l], bwd[c] += lb[l];
  }
  free(lf);
  free(lb);
  return first[C] == L ? ST_OK
                       : st_status_make(ST_CODE_CONFIG, "parallel.pipeline_layers covers %d layers of %d", first[C], L);
}

/* The builder's pipeline: the chunk table and costs, each parameter's
 * stage (before any slot is made). */
static st_status st__pipeline_init(st__builder* B, const st_plan_options* o) {
  B->P = o->parallel_pipeline;
  B->C = B->P * (o->sched.pipeline_schedule == ST_PLAN_PIPE_INTERLEAVED ? o->sched.pipeline_virtual : 1);
  B->first = st_xcalloc((size_t)B->C + 1, sizeof(int));
  B->cfwd = st_xcalloc((size_t)B->C, sizeof(double));
  B->cbwd = st_xcalloc((size_t)B->C, sizeof(double));
  ST_RETURN(st_plan_pipeline_layout(B->bundle, o, B->remat, B->first, B->cfwd, B->cbwd));
  for (int i = 0; i < B->n_inst; ++i)
    for (int k = 0; k < B->inst[i].count; ++k) B->param_stage[B->inst[i].params[k]] = st__inst_stage(B, i);
  B->plan->stages = B->P;
  return ST_OK;
}

/* Slot |src| of this stage copied to stage |to| as |name| (a SEND), and
 * freed here: the copy is what the next stage reads. */
static int st__send_to(st__builder* B, int src, int to, const char* name, int layer) {
  const int here = B->stage;
  B->stage = to;
  const st_tensor_type t = B->plan->slots[src].type; /* a copy: making a slot may move the table */
  int dst = st__act(B, name, &t);
  B->stage = here;
  st_plan_add(B->plan, ST_OP_SEND, -1, layer, B->micro, 0, 1, &src, 1, &dst);
  st_plan_add(B->plan, ST_OP_FREE, -1, layer, B->micro, 0, 1, &src, 0, NULL);
  return dst;
}

/* Tied embeddings: the head on the last stage reads a copy of wte, sent
 * at the start of the step (after the last step's update) and freed at
 * the end. */
static void st__wte_copy(st__builder* B, bool make) {
  if (!B->tied) return;
  B->micro = -1;
  int w = st__pslot(B, "", B->inst[0].params[0], ST_SLOT_PARAM, true);
  if (make && st__fsdp(B)) { /* fsdp blocks: the whole wte is gathered on the first stage and sent */
    st__gather(B, 0, -1);
    w = st__whole(B, "full:", B->inst[0].params[0], ST_SLOT_GATHERED);
  }
  B->stage = B->P - 1;
  if (make) {
    const st_tensor_type t = B->plan->slots[w].type; /* copies: making a slot may move the table */
    char name[256];
    snprintf(name, sizeof(name), "%s", B->plan->slots[w].name);
    B->wte_copy = st__slot(B, name, ST_SLOT_PARAM, &t, false, false, B->P - 1);
    st_plan_add(B->plan, ST_OP_SEND, -1, -1, -1, 0, 1, &w, 1, &B->wte_copy);
    if (st__fsdp(B)) { /* gathered again at the embedding's first use */
      int full[ST__MAX_GROUP_PARAMS];
      const st__instance* E = &B->inst[0];
      for (int k = 0; k < E->count; ++k) full[k] = st__whole(B, "full:", E->params[k], ST_SLOT_GATHERED);
      st_plan_add(B->plan, ST_OP_FREE, -1, -1, -1, 0, E->count, full, 0, NULL);
      B->gathered[0] = false;
    }
  } else {
    st_plan_add(B->plan, ST_OP_FREE, -1, -1, -1, 0, 1, &B->wte_copy, 0, NULL);
  }
}

/* Microbatch |m|'s forward through chunk |c| on its stage, its output sent
 * on to the next chunk's stage. */
static void st__chunk_forward(st__builder* B, int m, int c, bool eval) {
  st__fwd_out* f = &B->fo[m];
  int x = f->x;
  if (c == 0) {
    st__batch(B, m, eval, f, true, false);
    x = st__embed_forward(B, m, eval, f);
  }
  x = st__blocks_forward(B, m, eval, B->first[c], B->first[c + 1], x, f);
  /* An evaluation's last chunk on this stage: its positions are done. */
  if (eval && c + B->P >= B->C) st__positions_free(B, m, f);
  if (c < B->C - 1) {
    char name[64];
    snprintf(name, sizeof(name), "x[%d]", B->first[c + 1]);
    x = st__send_to(B, x, (c + 1) % B->P, name, B->first[c + 1]);
  }
  f->x = x;
}

/* Microbatch |m|'s backward through chunk |c| (the last: from the head's
 * loss), its input gradient sent back to the previous chunk's stage. */
static void st__chunk_backward(st__builder* B, const st__optimizer* opt, int m, bool last, int c) {
  st__fwd_out* f = &B->fo[m];
  int pending = -1, dx = f->dx;
  if (c == B->C - 1) {
    st__batch(B, m, false, f, false, true);
    dx = st__head_backward(B, opt, m, last, f, &pending);
  }
  dx = st__blocks_backward(B, opt, m, last, B->first[c], B->first[c + 1], dx, &pending, f);
  /* The stage's first chunk (not the embedding's: it frees its own) ends
   * its use of the positions in this step. */
  if (c != 0 && c < B->P) st__positions_free(B, m, f);
  if (c == 0) {
    st__embed_backward(B, opt, m, last, f, dx, &pending);
  } else {
    f->dx = st__send_to(B, dx, (c - 1) % B->P, "dx", B->first[c] - 1);
    if (st__fsdp(B)) st__after_scatter(B, opt, pending, m, last); /* the chunk's first layer's */
  }
}

/* The step's microbatches in the schedule's order (st_pipe_schedule_make):
 * each task's ops on its stage. */
static st_status st__pipeline_step(st__builder* B, const st_plan_options* o, const st__optimizer* opt, int M) {
  st_pipe_schedule S;
  ST_RETURN(st_pipe_schedule_make(o->sched.pipeline_schedule, B->P, B->C / B->P, M, B->cfwd, B->cbwd, &S));
  if (st__fsdp(B)) st__plan_uses_pipeline(B, S.tasks, S.n, 0);
  B->fo = st_xcalloc((size_t)M, sizeof(st__fwd_out));
  st__wte_copy(B, true);
  bool before_last = false;
  for (int k = 0; k < S.n; ++k) {
    const st_pipe_task* t = &S.tasks[k];
    if (t->backward && t->micro == M - 1 && !before_last) { /* per_layer: lr and scalars before any final gradient */
      B->micro = -1;
      opt->before_last_backward(B);
      before_last = true;
    }
    B->stage = t->stage;
    B->micro = t->micro;
    const int first_op = B->plan->op_count;
    if (t->backward) st__chunk_backward(B, opt, t->micro, t->micro == M - 1, t->chunk);
    else st__chunk_forward(B, t->micro, t->chunk, false);
    for (int i = first_op; i < B->plan->op_count; ++i) B->plan->ops[i].task = k;
  }
  st__wte_copy(B, false);
  B->stage = 0;
  B->micro = -1;
  st_plan_set_pipeline(B->plan, S.tasks, S.n, B->first, B->C);
  st_pipe_schedule_free(&S);
  return ST_OK;
}

static void st__pipeline_evaluation(st__builder* B, int EM) {
  if (st__fsdp(B)) {
    st__plan_uses_pipeline(B, NULL, 0, EM);
    memset(B->gathered, 0, (size_t)B->n_inst * sizeof(bool));
  }
  B->fo = st_xcalloc((size_t)EM, sizeof(st__fwd_out));
  st__wte_copy(B, true);
  for (int m = 0; m < EM; ++m) {
    B->micro = m;
    for (int c = 0; c < B->C; ++c) {
      B->stage = c % B->P;
      st__chunk_forward(B, m, c, true);
    }
    st__batch(B, m, true, &B->fo[m], false, true);
    st__head_eval(B, m, &B->fo[m]);
  }
  st__wte_copy(B, false);
  B->stage = 0;
  B->micro = -1;
}

/*===-------------------------------------------------------------------===*/
/* Evaluation                                                               */
/*===-------------------------------------------------------------------===*/

/* The head's eval(head params, [wte], x, targets, mask) -> loss of
 * microbatch |m|, then READ the loss. */
static void st__head_eval(st__builder* B, int m, const st__fwd_out* f) {
  const st__instance* H = &B->inst[B->n_inst - 1];
  const st_tensor_type scalar = {ST_DTYPE_F32, 0, {0}};
  int in[ST__MAX_IO];
  st__use_begin(B);
  const int n = st__head_inputs(B, f, in);
  int loss = st__xfer(B, "eval_loss", &scalar);
  st__plan_launch(B, ST_OP_LAUNCH, H->stage->eval, -1, m, n, in, 1, &loss);
  st__use_end(B);
  int freed[3] = {f->x, f->targets, f->mask};
  st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 3, freed, 0, NULL);
  st_plan_add(B->plan, ST_OP_READ, -1, -1, m, ST_TAG_EVAL_LOSS, 1, &loss, 0, NULL);
  st_plan_add(B->plan, ST_OP_FREE, -1, -1, m, 0, 1, &loss, 0, NULL);
}

/* Per microbatch: the forward, the head's eval, READ the loss. A pipeline
 * passes each microbatch through the stages in turn (the executor overlaps
 * the next microbatch's first stages with it: st_pipe). */
static void st__evaluation(st__builder* B, int EM) {
  st__state_slots(B, false);
  if (B->P > 1) {
    st__pipeline_evaluation(B, EM);
    return;
  }
  if (st__fsdp(B)) {
    st__plan_uses(B, EM, true);
    memset(B->gathered, 0, (size_t)B->n_inst * sizeof(bool));
  }
  for (int m = 0; m < EM; ++m) {
    st__fwd_out f = {0};
    st__forward(B, m, true, &f);
    st__head_eval(B, m, &f);
  }
}

/*===-------------------------------------------------------------------===*/
/* Policies: offload and waits                                              */
/*===-------------------------------------------------------------------===*/

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
      int s;
      if (par && (s = st_plan_slot_find(plan, pname)) >= 0) unit[s] = u_par;
    }
    /* The instance's optimizer state: its update's state slots,
     * "<kind>:<parameter>" (st__opt_slot), whatever the kinds. */
    for (int s = 0; opt && s < plan->slot_count; ++s) {
      const char* colon = plan->slots[s].category == ST_SLOT_OPT ? strchr(plan->slots[s].name, ':') : NULL;
      for (int k = 0; colon && k < inst[i].count; ++k)
        if (!strcmp(colon + 1, b->params[inst[i].params[k]].name)) unit[s] = u_opt;
    }
  }
  return unit;
}

/* Logical plan -> offload pass -> wait pass -> finalize. Takes |logical|. */
static st_status st__apply_policies(st_plan* logical, const st_bundle* b, const st__instance* inst, int n_inst,
                                    const st_plan_sched* p, int offload, st_plan* out) {
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

/* How the devices' buffers of each slot relate: batch rows and everything
 * computed from them are split, gradients are partial sums until reduced
 * (the slot keeps one layout; the COLLECTIVE that reduces it is in the
 * plan), the state and the optimizer scalars are replicated. Under FSDP
 * the state and the reduce-scattered gradients are sharded (st__pslot set
 * how), gathered parameters replicated and whole gradients partial. */
static bool st__is_split(const st_sharding* sh) {
  for (int d = 0; d < ST_MAX_RANK; ++d)
    if (sh->split[d]) return true;
  return false;
}

static void st__layouts(st_plan* plan) {
  for (int k = 0; k < plan->slot_count; ++k) {
    st_slot* sl = &plan->slots[k];
    if (sl->category == ST_SLOT_ACT || !strncmp(sl->name, "tokens[", 7) || !strncmp(sl->name, "targets[", 8) ||
        !strncmp(sl->name, "mask[", 5) || !strncmp(sl->name, "positions[", 10) || !strncmp(sl->name, "loss[", 5) || !strcmp(sl->name, "eval_loss") ||
        !strncmp(sl->name, "metric", 6))
      sl->layout = ST_LAYOUT_SPLIT;
    else if (sl->logical.rank > 0 && st__is_split(&sl->sharding))
      sl->layout = ST_LAYOUT_SHARDED;
    else if (sl->category == ST_SLOT_GRAD || sl->category == ST_SLOT_UNREDUCED)
      sl->layout = ST_LAYOUT_PARTIAL;
    /* Under FSDP a squared norm is of the device's own blocks: the norm is
     * their sum over fsdp (the host adds them, step_hooks.c). */
    else if (plan->mesh[1] > 1 && !strncmp(sl->name, "sq[", 3))
      sl->layout = ST_LAYOUT_PARTIAL;
    else
      sl->layout = ST_LAYOUT_REPLICATED;
  }
}

/* Data and fully-sharded parallelism need a bundle exported for this mesh,
 * with each group's collectives (and, for fsdp, its optimizer programs on
 * fsdp blocks), and reductions that precede per-layer updates. */
static st_status st__check_mesh(const st_bundle* b, const st_plan_options* o) {
  const int D = o->parallel_data > 1 ? o->parallel_data : 1, F = o->parallel_fsdp > 1 ? o->parallel_fsdp : 1;
  const int T = o->parallel_tensor > 1 ? o->parallel_tensor : 1;
  if (b->mesh_data != D || b->mesh_fsdp != F || b->mesh_tensor != T)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s was exported for mesh data=%d fsdp=%d tensor=%d, the config has "
                          "parallel.data=%d parallel.fsdp=%d parallel.tensor=%d; re-export it (unset bundle.dir to use the cache)",
                          b->dir, b->mesh_data, b->mesh_fsdp, b->mesh_tensor, D, F, T);
  if (T > 1)
    for (int l = 0; l < b->layer_count; ++l)
      if (!st_bundle_collective_find(b, b->layers[l].fwd->name) || !st_bundle_collective_find(b, b->layers[l].bwd_res->name))
        return st_status_make(ST_CODE_RUNTIME, "bundle %s: layer %d's programs are not tensor-parallel SPMD programs "
                              "(manifest spmd_programs); re-export it",
                              b->dir, l);
  for (int i = 0; i < b->group_count; ++i) {
    const st_bundle_group* g = &b->groups[i];
    if (D > 1 && !g->data_all_reduce)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: group '%s' has no data all-reduce (manifest collectives); re-export it",
                            b->dir, g->name);
    if (F > 1 && (!g->fsdp_all_gather || !g->fsdp_reduce_scatter || !g->shard_update))
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: group '%s' lacks its fsdp all-gather, reduce-scatter or "
                            "shard_programs (manifest collectives, groups); re-export it",
                            b->dir, g->name);
  }
  /* fsdp across processes: the shard programs on one process's block. */
  const int X = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_FSDP ? o->procs : 1;
  if (X > 1 && b->process_fsdp != X)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s was exported for fsdp across %d processes, the job has %d; re-export "
                          "it (unset bundle.dir to use the cache)",
                          b->dir, b->process_fsdp, X);
  for (int i = 0; X > 1 && i < b->group_count; ++i)
    if (!b->groups[i].shard_update)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: group '%s' lacks its shard_programs for fsdp across processes; "
                            "re-export it",
                            b->dir, b->groups[i].name);
  /* The offload pass moves parameters around LAUNCH ops only; under FSDP
   * the all-gathers read them too, and a gathered copy is what the
   * launches use anyway. */
  if (F * X > 1 && (o->sched.offload & ST_OFFLOAD_PARAMS))
    return st_status_make(ST_CODE_CONFIG,
                          "sched.offload=%s with parallel.fsdp=%d: parameter offload is not built for fully-sharded "
                          "parameters; set sched.offload to none or optimizer",
                          o->sched.offload == 3 ? "both" : "params", F * X);
  if (o->sched.per_layer_optimizer && o->sched.bucketed_grad_reduce)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.optimizer=per_layer updates each layer as soon as its gradient is reduced, so it needs "
                          "sched.grad_reduce=per_layer (is bucketed) when parallel.data=%d",
                          D);
  return ST_OK;
}

static void st__policy_line(const st_plan_sched* pol, const st_plan_remat_choice* rc, int data, int fsdp, int tensor,
                            char* out, size_t size) {
  if (data > 1 || fsdp > 1 || tensor > 1) {
    char tail[192] = "";
    if (data > 1 && pol->bucketed_grad_reduce)
      snprintf(tail, sizeof(tail), " data=%d grad_reduce=bucketed grad_bucket_bytes=%lld", data, (long long)pol->grad_bucket_bytes);
    else if (data > 1)
      snprintf(tail, sizeof(tail), " data=%d grad_reduce=per_layer", data);
    if (fsdp > 1)
      snprintf(tail + strlen(tail), sizeof(tail) - strlen(tail), " fsdp=%d gather_prefetch=%d reshard_after_forward=%s", fsdp,
               pol->gather_prefetch, pol->reshard_after_forward ? "true" : "false");
    if (tensor > 1) snprintf(tail + strlen(tail), sizeof(tail) - strlen(tail), " tensor=%d", tensor);
    st__policy_line(pol, rc, 1, 1, 1, out, size);
    snprintf(out + strlen(out), size - strlen(out), "%s", tail);
    return;
  }
  /* auto names what it chose and the budget it chose for (the why is in
   * the plan event and `strata plan`'s "# remat" line). */
  char remat[192];
  if (rc->automatic) {
    char layers[128];
    st_plan_remat_text(rc->remat, rc->layers, layers, sizeof(layers));
    snprintf(remat, sizeof(remat), "auto:%s memory_budget=%lld", layers, (long long)rc->budget);
  } else if (pol->remat.text) {
    snprintf(remat, sizeof(remat), "%s", pol->remat.text); /* as written */
  } else {
    st_plan_remat_text(rc->remat, rc->layers, remat, sizeof(remat));
  }
  snprintf(out, size, "remat=%s offload=%s prefetch_depth=%d wait=%s optimizer=%s", remat,
           pol->offload == 3 ? "both" : pol->offload == ST_OFFLOAD_OPTIMIZER ? "optimizer"
                                    : pol->offload == ST_OFFLOAD_PARAMS  ? "params"
                                                                         : "none",
           pol->prefetch_depth, pol->eager ? "eager" : "deferred",
           pol->per_layer_optimizer ? "per_layer" : "after_backward");
}

/*===-------------------------------------------------------------------===*/
/* The step, top to bottom                                                  */
/*===-------------------------------------------------------------------===*/

/* A builder for |plan| on the config's mesh (the plan's mesh fields too). */
static st_status st__builder_init(st__builder* B, st_plan* plan, const st_bundle* b, const st_plan_options* o,
                                  const st__instance* inst, int n_inst, const bool* remat) {
  const st_plan_sched* pol = &o->sched;
  const int DATA = o->parallel_data > 1 ? o->parallel_data : 1, F = o->parallel_fsdp > 1 ? o->parallel_fsdp : 1;
  const int TP = o->parallel_tensor > 1 ? o->parallel_tensor : 1;
  plan->devices = DATA * F * TP;
  plan->mesh[0] = DATA;
  plan->mesh[1] = F;
  plan->mesh[2] = TP;
  /* One SPMD op in flight at a time, on every mesh: on the CPU plugin two
   * collectives (or tensor-parallel programs) in flight can each hold part
   * of its thread pool in a rendezvous and wait for each other forever, or
   * start in different orders on different devices (fsdp=2 on 2 CPU
   * devices aborted after XLA's 40 s in 3 of 3 runs; fsdp=2 x tensor=2
   * likewise; docs/parallelism.md, "Ordering"). Data parallelism alone was
   * never seen to, but nothing rules it out. */
  plan->serialize_spmd = plan->devices > 1;
  plan->procs = o->procs > 1 ? o->procs : 1;
  st__builder init = {.plan = plan, .bundle = b, .inst = inst, .n_inst = n_inst, .L = n_inst - 2, .remat = remat,
                      .tied = b->model.tie_embeddings, .positions = st__takes_positions(b), .sq = st_xcalloc((size_t)n_inst, sizeof(int)),
                      .bucketed = pol->bucketed_grad_reduce, .bucket_bytes = pol->grad_bucket_bytes,
                      .pending = st_xcalloc((size_t)n_inst, sizeof(int)), .F = F, .data = DATA, .T = TP,
                      .gather_prefetch = pol->gather_prefetch, .reshard = pol->reshard_after_forward,
                      .gathered = st_xcalloc((size_t)n_inst, sizeof(bool)), .numerics = o->numerics,
                      .xdata = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_DATA ? o->procs : 1,
                      .X = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_FSDP ? o->procs : 1,
                      .P = 1, .C = 1, .micro = -1, .wte_copy = -1};
  *B = init;
  memset(B->sc, -1, sizeof(B->sc));
  B->param_stage = st_xcalloc((size_t)b->param_count + 1, sizeof(int));
  B->nstat = st_xmalloc((size_t)n_inst * sizeof(int));
  for (int i = 0; i < n_inst; ++i) B->nstat[i] = -1;
  if (o->parallel_pipeline > 1) return st__pipeline_init(B, o);
  return ST_OK;
}

static void st__builder_free(st__builder* B) {
  free(B->first);
  free(B->cfwd);
  free(B->cbwd);
  free(B->param_stage);
  free(B->fo);
  free(B->nstat);
  free(B->astat);
  free(B->uses);
  free(B->gathered);
  free(B->pending);
  free(B->sq);
}

/* The training step for the layers |remat|: the logical plan, then the
 * policies (offload, waits), finalized into |out|. sched.remat=auto builds
 * one of these per candidate. */
static st_status st__step(const st_bundle* b, const st_plan_options* o, const st__instance* inst, int n_inst,
                          const bool* remat, st_plan* out) {
  st_plan_init(out);
  const st_plan_sched* pol = &o->sched;
  st_plan step;
  st_plan_init(&step);
  st__builder B;
  st_status s = st__builder_init(&B, &step, b, o, inst, n_inst, remat);
  const st__optimizer* opt = pol->per_layer_optimizer ? &st__per_layer : &st__after_backward;

  if (!s) st__state_slots(&B, true);
  const int M = (int)o->microbatches;
  if (!s && st__fsdp(&B) && B.P <= 1) st__plan_uses(&B, M, false);
  if (!s && B.P > 1) s = st__pipeline_step(&B, o, opt, M);
  for (int m = 0; !s && B.P <= 1 && m < M; ++m) {
    const bool last = m == M - 1;
    st__fwd_out f = {0};
    st__forward(&B, m, false, &f);
    if (last) opt->before_last_backward(&B);
    st__backward(&B, opt, m, last, &f);
  }
  if (s) {
    st__builder_free(&B);
    st_plan_deinit(&step);
    return s;
  }
  st__flush_reductions(&B); /* bucketed: what is left after the backward */
  st__read_losses(&B, M);
  opt->finish(&B);
  if (step.devices > 1) st__layouts(&step);
  st__builder_free(&B);
  return st__apply_policies(&step, b, inst, n_inst, pol, pol->offload, out);
}

typedef struct {
  const st_bundle* b;
  const st_plan_options* o;
  const st__instance* inst;
  int n_inst;
} st__candidates;

static st_status st__candidate_peak(void* user, const bool* remat, int64_t* out_peak) {
  const st__candidates* c = user;
  st_plan p;
  ST_RETURN(st__step(c->b, c->o, c->inst, c->n_inst, remat, &p));
  *out_peak = st_plan_predict_live(&p, NULL, NULL);
  st_plan_deinit(&p);
  return ST_OK;
}

/* sched.memory_budget in bytes: as given, or its fraction of the device
 * memory the plugin reports (a config error when it reports none). */
static st_status st__memory_budget(const st_plan_options* o, int64_t* out_bytes, double* out_fraction) {
  *out_bytes = o->sched.memory_budget_bytes;
  *out_fraction = o->sched.memory_budget_fraction;
  if (*out_fraction <= 0) return ST_OK;
  if (o->device_memory <= 0)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.memory_budget '%s' (%s) is a fraction of the device's memory, but the PJRT plugin does "
                          "not report its devices' memory (PJRT_Device_MemoryStats gives no bytes_limit); give the "
                          "budget in bytes, e.g. sched.memory_budget=1000000000",
                          o->sched.memory_budget_text ? o->sched.memory_budget_text : "",
                          o->sched.memory_budget_source ? o->sched.memory_budget_source : "options");
  *out_bytes = (int64_t)(*out_fraction * (double)o->device_memory);
  if (*out_bytes < 1) *out_bytes = 1;
  return ST_OK;
}

st_status st_plan_build(const st_bundle* b, const st_plan_options* o, st_plan* step_out, st_plan* eval_out,
                        st_plan_remat_choice* choice_out) {
  st_plan_init(step_out);
  st_plan_init(eval_out);
  if (choice_out) memset(choice_out, 0, sizeof(*choice_out));
  const st_plan_sched* pol = &o->sched;
  st__instance* inst = NULL;
  int n_inst = 0;
  ST_RETURN(st__instances(b, &inst, &n_inst));
  st_status s = st_config_check_per_layer_clip(pol->per_layer_optimizer, o->grad_clip);
  const int DATA = o->parallel_data > 1 ? o->parallel_data : 1, F = o->parallel_fsdp > 1 ? o->parallel_fsdp : 1;
  const int TP = o->parallel_tensor > 1 ? o->parallel_tensor : 1;
  const int D = DATA * F * TP;
  const bool xfsdp = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_FSDP;
  if (!s && (D > 1 || o->parallel_tensor > 1 || xfsdp)) s = st__check_mesh(b, o);
  if (!s) s = st__check_updates(b, F > 1 || xfsdp, F > 1 || TP > 1 || xfsdp);
  if (s) {
    free(inst);
    return s;
  }
  const int L = n_inst - 2;

  /* --- the training step: sched.remat's layers, or auto's choice --------- */
  st_plan_remat_choice rc;
  memset(&rc, 0, sizeof(rc));
  if (pol->remat.kind == ST_CONFIG_REMAT_AUTO) {
    int64_t budget = 0;
    double fraction = 0;
    s = st__memory_budget(o, &budget, &fraction);
    st__candidates cand = {b, o, inst, n_inst};
    if (!s) s = st_plan_remat_auto(L, budget, st__candidate_peak, &cand, &rc);
    rc.budget_fraction = fraction;
    rc.device_memory = o->device_memory;
  } else {
    rc.layers = L;
    rc.remat = st_xcalloc((size_t)L + 1, sizeof(bool));
    s = st_config_remat_layers(&pol->remat, L, rc.remat);
    for (int l = 0; l < L; ++l) rc.recomputed += rc.remat[l];
  }
  if (!s) s = st__step(b, o, inst, n_inst, rc.remat, step_out);
  if (!s) rc.predicted_peak = st_plan_predict_live(step_out, NULL, NULL);

  /* --- the evaluation ---------------------------------------------------- */
  if (!s) {
    st_plan eval;
    st_plan_init(&eval);
    st__builder B;
    s = st__builder_init(&B, &eval, b, o, inst, n_inst, rc.remat);
    if (!s) st__evaluation(&B, (int)(o->eval_batches * o->microbatches));
    if (D > 1) st__layouts(&eval);
    st__builder_free(&B);
    /* Evaluation has no optimizer state; offloaded parameters stream as in training. */
    if (!s) s = st__apply_policies(&eval, b, inst, n_inst, pol, pol->offload & ST_OFFLOAD_PARAMS, eval_out);
    else st_plan_deinit(&eval);
  }
  free(inst);
  if (s) {
    st_plan_deinit(step_out);
    st_plan_deinit(eval_out);
    st_plan_remat_choice_deinit(&rc);
    return s;
  }
  char policy[384];
  const int xdata = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_DATA ? o->procs : 1;
  const int xf = xfsdp ? o->procs : 1;
  st__policy_line(pol, &rc, DATA * xdata, F * xf, TP, policy, sizeof(policy));
  if (o->procs > 1)
    snprintf(policy + strlen(policy), sizeof(policy) - strlen(policy), " processes=%d across=%s", o->procs,
             xfsdp ? "fsdp" : "data");
  if (o->parallel_pipeline > 1) {
    static const char* const names[3] = {"1f1b", "gpipe", "interleaved"};
    snprintf(policy + strlen(policy), sizeof(policy) - strlen(policy), " pipeline=%d schedule=%s", o->parallel_pipeline,
             names[o->sched.pipeline_schedule]);
    if (o->sched.pipeline_schedule == ST_PLAN_PIPE_INTERLEAVED)
      snprintf(policy + strlen(policy), sizeof(policy) - strlen(policy), " virtual=%d", o->sched.pipeline_virtual);
  }
  st_plan_set_policy(step_out, policy);
  st_plan_set_policy(eval_out, policy);
  if (choice_out) *choice_out = rc;
  else st_plan_remat_choice_deinit(&rc);
  return ST_OK;
}
