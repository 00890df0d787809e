/* plan.c — the plan IR: slots, interned program names, ops, liveness
 * prediction and printing. */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/sched.h"

static void* st__xrealloc(void* p, size_t n) {
  void* q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "strata: out of memory building a plan\n");
    abort();
  }
  return q;
}

const char* st_slot_category_name(st_slot_category c) {
  switch (c) {
    case ST_SLOT_PARAM: return "params";
    case ST_SLOT_GRAD: return "grads";
    case ST_SLOT_OPT: return "optimizer";
    case ST_SLOT_ACT: return "activations";
    case ST_SLOT_XFER: return "transfer";
    case ST_SLOT_CATEGORY_COUNT: break;
  }
  return "?";
}

void st_plan_init(st_plan* plan) { memset(plan, 0, sizeof(*plan)); }

void st_plan_deinit(st_plan* plan) {
  for (int i = 0; i < plan->slot_count; ++i) free(plan->slots[i].name);
  free(plan->slots);
  for (int i = 0; i < plan->op_count; ++i) {
    free(plan->ops[i].inputs);
    free(plan->ops[i].outputs);
  }
  free(plan->ops);
  for (int i = 0; i < plan->program_count; ++i) free(plan->programs[i]);
  free(plan->programs);
  memset(plan, 0, sizeof(*plan));
}

int st_plan_slot_find(const st_plan* plan, const char* name) {
  for (int i = 0; i < plan->slot_count; ++i)
    if (!strcmp(plan->slots[i].name, name)) return i;
  return -1;
}

int st_plan_slot(st_plan* plan, const char* name, st_slot_category category, const st_tensor_type* type, bool persistent) {
  int found = st_plan_slot_find(plan, name);
  if (found >= 0) return found;
  plan->slots = st__xrealloc(plan->slots, (size_t)(plan->slot_count + 1) * sizeof(st_slot));
  st_slot* s = &plan->slots[plan->slot_count];
  s->name = strdup(name);
  s->category = category;
  s->type = *type;
  s->persistent = persistent;
  return plan->slot_count++;
}

int st_plan_program(st_plan* plan, const char* name) {
  for (int i = 0; i < plan->program_count; ++i)
    if (!strcmp(plan->programs[i], name)) return i;
  plan->programs = st__xrealloc(plan->programs, (size_t)(plan->program_count + 1) * sizeof(char*));
  plan->programs[plan->program_count] = strdup(name);
  return plan->program_count++;
}

st_op* st_plan_add(st_plan* plan, st_op_kind kind, int program, int layer, int micro, int tag, int input_count,
                   const int* inputs, int output_count, const int* outputs) {
  plan->ops = st__xrealloc(plan->ops, (size_t)(plan->op_count + 1) * sizeof(st_op));
  st_op* op = &plan->ops[plan->op_count++];
  op->kind = kind;
  op->program = program;
  op->layer = layer;
  op->micro = micro;
  op->tag = tag;
  op->input_count = input_count;
  op->inputs = st__xrealloc(NULL, (size_t)input_count * sizeof(int));
  if (input_count) memcpy(op->inputs, inputs, (size_t)input_count * sizeof(int));
  op->output_count = output_count;
  op->outputs = st__xrealloc(NULL, (size_t)output_count * sizeof(int));
  if (output_count) memcpy(op->outputs, outputs, (size_t)output_count * sizeof(int));
  return op;
}

/* Liveness follows the executor's rules exactly: an output slot becomes
 * live when written (replacing what it held), FREE empties a slot, and a
 * donated input's memory is reused by the output that aliases it — which
 * the slot model captures because donated slots are always refilled by the
 * same op. Persistent slots start live. */
int64_t st_plan_predict_live(const st_plan* plan, int64_t* out) {
  bool* live = calloc((size_t)plan->slot_count + 1, sizeof(bool));
  int64_t cat[ST_SLOT_CATEGORY_COUNT] = {0};
  for (int i = 0; i < plan->slot_count; ++i) {
    if (plan->slots[i].persistent) {
      live[i] = true;
      cat[plan->slots[i].category] += (int64_t)st_tensor_type_bytes(&plan->slots[i].type);
    }
  }
  int64_t peak = 0;
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) peak += cat[k];
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind == ST_OP_FREE) {
      for (int j = 0; j < op->input_count; ++j) {
        int s = op->inputs[j];
        if (live[s]) cat[plan->slots[s].category] -= (int64_t)st_tensor_type_bytes(&plan->slots[s].type);
        live[s] = false;
      }
    }
    for (int j = 0; j < op->output_count; ++j) {
      int s = op->outputs[j];
      if (!live[s]) cat[plan->slots[s].category] += (int64_t)st_tensor_type_bytes(&plan->slots[s].type);
      live[s] = true;
    }
    int64_t total = 0;
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) {
      total += cat[k];
      if (out) out[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k] = cat[k];
    }
    if (total > peak) peak = total;
  }
  free(live);
  return peak;
}

static const char* st__op_name(st_op_kind k) {
  switch (k) {
    case ST_OP_LAUNCH: return "LAUNCH";
    case ST_OP_H2D: return "H2D";
    case ST_OP_READ: return "READ";
    case ST_OP_HOST: return "HOST";
    case ST_OP_FREE: return "FREE";
  }
  return "?";
}

static void st__slot_list(const st_plan* plan, const int* slots, int n, st_strbuf* b) {
  st_strbuf_append(b, "[");
  for (int i = 0; i < n; ++i) st_strbuf_printf(b, "%s%s", i ? " " : "", plan->slots[slots[i]].name);
  st_strbuf_append(b, "]");
}

void st_plan_print(const st_plan* plan, FILE* out) {
  int64_t* live = calloc((size_t)plan->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t peak = st_plan_predict_live(plan, live);
  fprintf(out, "# %d ops, %d slots, %d programs; predicted peak live device bytes %lld\n", plan->op_count,
          plan->slot_count, plan->program_count, (long long)peak);
  fprintf(out, "# live bytes after each op: params/grads/optimizer/activations/transfer\n");
  st_strbuf b = {0};
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    st_strbuf_reset(&b);
    st_strbuf_printf(&b, "%5d %-6s", i, st__op_name(op->kind));
    if (op->kind == ST_OP_LAUNCH) st_strbuf_printf(&b, " %s", plan->programs[op->program]);
    if (op->layer >= 0) st_strbuf_printf(&b, " layer=%d", op->layer);
    if (op->micro >= 0) st_strbuf_printf(&b, " micro=%d", op->micro);
    if (op->input_count) {
      st_strbuf_append(&b, " in=");
      st__slot_list(plan, op->inputs, op->input_count, &b);
    }
    if (op->output_count) {
      st_strbuf_append(&b, " out=");
      st__slot_list(plan, op->outputs, op->output_count, &b);
    }
    const int64_t* l = &live[(size_t)i * ST_SLOT_CATEGORY_COUNT];
    fprintf(out, "%s  live=%lld/%lld/%lld/%lld/%lld\n", b.data, (long long)l[0], (long long)l[1], (long long)l[2],
            (long long)l[3], (long long)l[4]);
  }
  st_strbuf_free(&b);
  free(live);
}

void st_plan_print_json(const st_plan* plan, FILE* out) {
  int64_t* live = calloc((size_t)plan->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t peak = st_plan_predict_live(plan, live);
  st_strbuf b = {0};
  st_strbuf_printf(&b, "{\"predicted_peak_bytes\": %lld, \"programs\": [", (long long)peak);
  for (int i = 0; i < plan->program_count; ++i) {
    if (i) st_strbuf_append(&b, ", ");
    st_strbuf_json_string(&b, plan->programs[i]);
  }
  st_strbuf_append(&b, "],\n \"slots\": [");
  for (int i = 0; i < plan->slot_count; ++i) {
    const st_slot* s = &plan->slots[i];
    char t[128];
    st_strbuf_append(&b, i ? ",\n  {\"name\": " : "\n  {\"name\": ");
    st_strbuf_json_string(&b, s->name);
    st_strbuf_printf(&b, ", \"category\": \"%s\", \"type\": \"%s\", \"bytes\": %zu, \"persistent\": %s}",
                     st_slot_category_name(s->category), st_tensor_type_format(&s->type, t, sizeof(t)),
                     st_tensor_type_bytes(&s->type), s->persistent ? "true" : "false");
  }
  st_strbuf_append(&b, "],\n \"ops\": [");
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    st_strbuf_printf(&b, "%s\n  {\"index\": %d, \"kind\": \"%s\"", i ? "," : "", i, st__op_name(op->kind));
    if (op->kind == ST_OP_LAUNCH) {
      st_strbuf_append(&b, ", \"program\": ");
      st_strbuf_json_string(&b, plan->programs[op->program]);
    }
    st_strbuf_printf(&b, ", \"layer\": %d, \"micro\": %d, \"inputs\": [", op->layer, op->micro);
    for (int j = 0; j < op->input_count; ++j) st_strbuf_printf(&b, "%s%d", j ? ", " : "", op->inputs[j]);
    st_strbuf_append(&b, "], \"outputs\": [");
    for (int j = 0; j < op->output_count; ++j) st_strbuf_printf(&b, "%s%d", j ? ", " : "", op->outputs[j]);
    st_strbuf_append(&b, "], \"live_bytes\": {");
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      st_strbuf_printf(&b, "%s\"%s\": %lld", k ? ", " : "", st_slot_category_name((st_slot_category)k),
                       (long long)live[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k]);
    st_strbuf_append(&b, "}}");
  }
  st_strbuf_append(&b, "]}\n");
  fputs(b.data, out);
  st_strbuf_free(&b);
  free(live);
}
