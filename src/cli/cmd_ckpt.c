/* cmd_ckpt.c — `strata ckpt list|verify|inspect PATH`.
 *
 * PATH is a run directory, its checkpoints/ folder, one checkpoint folder
 * (step_<N>), or (inspect only) a .safetensors file. Verification here
 * knows no model, so it checks everything a checkpoint says about itself:
 * manifest checksum, files, shapes, dtypes, per-tensor checksums. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/obs.h"
#include "strata/train.h"

static void st__inspect_identity(const st_ckpt* c);

static const char* kUsage =
    "usage: strata ckpt list|verify|inspect PATH [--json]\n"
    "  list PATH      the checkpoints of a run (PATH: run directory or its checkpoints/), each verified\n"
    "  verify PATH    verify one checkpoint folder, or every checkpoint of a run; exit 7 if any is invalid\n"
    "  inspect PATH   manifest and tensor table of a checkpoint folder or a .safetensors file (--json: the manifest)";

static bool st__is_ckpt_dir(const char* path) {
  char* m = st_path_join(path, ST_CKPT_MANIFEST);
  bool yes = st_fs_exists(m);
  free(m);
  if (yes) return true;
  /* A damaged checkpoint (manifest gone) is still one when it is named like one. */
  const char* slash = strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  if (slash && !slash[1]) return false;
  return !strncmp(base, "step_", 5) && st_fs_is_dir(path);
}

/* The checkpoints folder for PATH (caller frees), or NULL. */
static char* st__root_of(const char* path) {
  char* sub = st_rundir_path(path, ST_RUNDIR_CHECKPOINTS);
  if (st_fs_is_dir(sub)) return sub;
  free(sub);
  if (!st_fs_is_dir(path)) return NULL;
  return st_xstrdup(path);
}

static void st__human_bytes(double b, char* out, size_t n) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  snprintf(out, n, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

static int64_t st__ckpt_bytes(const st_ckpt* c) {
  int64_t n = 0;
  for (int i = 0; i < c->file_count; ++i) n += (int64_t)c->files[i].bytes;
  return n;
}

static void st__print_temporaries(const char* root) {
  DIR* d = opendir(root);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, ST_CKPT_TMP_PREFIX, strlen(ST_CKPT_TMP_PREFIX))) continue;
    printf("  %-10s %-8s %s\n", "-", "partial", e->d_name);
    printf("             an unfinished write (crashed save); never loaded, removed by the next resume\n");
  }
  closedir(d);
}

/* LATEST's content for printing: at most 64 printable characters. */
static void st__printable(const char* s, char* out, size_t n) {
  size_t k = 0;
  for (; s[k] && k + 1 < n && k < 64; ++k) out[k] = (s[k] >= 0x20 && s[k] < 0x7f) ? s[k] : '?';
  out[k] = '\0';
}

/* list and verify over a checkpoints folder. Returns the invalid count;
 * *out_latest_bad tells whether LATEST names no checkpoint of |root|. */
static int st__each(const char* root, bool verbose_ok, int* out_total, bool* out_latest_bad) {
  st_ckpt_entry* v = NULL;
  int n = 0;
  st_status s = st_ckpt_list(root, &v, &n);
  if (s) {
    fprintf(stderr, "strata: %s\n", st_status_message(s));
    st_status_free(s);
    *out_total = 0;
    return 1;
  }
  char* latest = st_ckpt_read_latest(root);
  /* LATEST is data from disk: flagged when it names no checkpoint here
   * (a path like ../../../etc included), and never followed. */
  const char* why = latest ? st_ckpt_latest_problem(root, latest) : NULL;
  char shown[80] = "none";
  if (latest) st__printable(latest, shown, sizeof(shown));
  *out_latest_bad = why != NULL;
  printf("checkpoints in %s (LATEST: %s%s)\n", root, shown, why ? ", INVALID" : "");
  if (why) {
    printf("  LATEST is '%s': %s; ignored (resume takes the newest valid checkpoint, not LATEST)\n", shown, why);
    free(latest);
    latest = NULL;
  }
  printf("  %-10s %-8s %-10s %-19s %s\n", "step", "status", "size", "saved", "note");
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    st_ckpt* c = NULL;
    st_status r = st_ckpt_open(v[i].dir, NULL, &c);
    bool is_latest = latest && !strcmp(latest, v[i].name);
    if (r) {
      ++bad;
      printf("  %-10lld %-8s %-10s %-19s %s\n", (long long)v[i].step, "INVALID", "-", "-", is_latest ? "LATEST" : "");
      printf("             %s\n", st_status_message(r));
      st_status_free(r);
      continue;
    }
    char size[32], when[32] = "-";
    st__human_bytes((double)st__ckpt_bytes(c), size, sizeof(size));
    time_t t = (time_t)c->created;
    struct tm tm;
    if (c->created > 0 && localtime_r(&t, &tm)) strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    printf("  %-10lld %-8s %-10s %-19s %s%s\n", (long long)c->step, "valid", size, when, is_latest ? "LATEST " : "",
           verbose_ok ? "checksums verified" : "");
    st_ckpt_free(c);
  }
  if (n == 0) printf("  (none)\n");
  st__print_temporaries(root);
  free(latest);
  st_ckpt_entries_free(v, n);
  *out_total = n;
  return bad;
}

static int st__inspect_file(const char* path) {
  st_safetensors* f = NULL;
  st_status s = st_safetensors_read(path, &f);
  if (s) return st_cli_report(s);
  printf("%s: safetensors, %zu bytes, header %zu bytes, %d tensors\n", path, f->size, f->data_start, f->count);
  printf("  %-40s %-6s %-20s %12s %16s\n", "name", "dtype", "shape", "bytes", "xxh64");
  for (int i = 0; i < f->count; ++i) {
    const st_safetensors_entry* e = &f->entries[i];
    char t[96];
    st_tensor_type_format(&e->type, t, sizeof(t));
    const char* br = strchr(t, '[');
    printf("  %-40s %-6s %-20s %12zu %016llx\n", e->name, st_safetensors_dtype_name(e->type.dtype), br ? br : "[]", e->bytes,
           (unsigned long long)st_hash64(f->data + e->offset, e->bytes, 0));
  }
  st_safetensors_free(f);
  return 0;
}

static int st__inspect(const char* path, bool json) {
  size_t n = strlen(path);
  if (n > 12 && !strcmp(path + n - 12, ".safetensors")) return st__inspect_file(path);
  if (json) {
    char* m = st_path_join(path, ST_CKPT_MANIFEST);
    char* text = NULL;
    size_t size = 0;
    st_status s = st_fs_read_file(m, &text, &size);
    free(m);
    if (s) return st_cli_report(st_status_annotate(s, "strata ckpt inspect"));
    fwrite(text, 1, size, stdout);
    free(text);
    return 0;
  }
  st_ckpt* c = NULL;
  st_status s = st_ckpt_open(path, NULL, &c);
  if (s) return st_cli_report(s);
  char size[32];
  st__human_bytes((double)st__ckpt_bytes(c), size, sizeof(size));
  printf("checkpoint %s (format version %d): verified\n", c->dir, c->version);
  printf("  step            %lld\n", (long long)c->step);
  printf("  optimizer step  %lld\n", (long long)c->optimizer_step);
  printf("  data position   %lld sequences (batch size %lld)\n", (long long)c->data_position, (long long)c->batch_size);
  printf("  rng             seed %llu (init and sampler are stateless)\n", (unsigned long long)c->seed);
  const json_t* sched = json_object_get(c->lr_schedule, "schedule");
  printf("  lr schedule     %s, lr %.6g at step %lld of %lld\n", json_is_string(sched) ? json_string_value(sched) : "(not recorded)",
         c->lr, (long long)c->step, (long long)c->total_steps);
  printf("  config hash     %s\n", c->config_hash);
  printf("  bundle key      %s\n", c->bundle_key);
  printf("  tokenizer       %s\n", c->tokenizer_hash ? c->tokenizer_hash : "(not recorded)");
  if (c->mesh_devices > 0)
    printf("  mesh            data=%d fsdp=%d tensor=%d (%d device%s, %d process%s)\n", c->mesh_data, c->mesh_fsdp, c->mesh_tensor,
           c->mesh_devices, c->mesh_devices == 1 ? "" : "s", c->mesh_processes > 1 ? c->mesh_processes : 1,
           c->mesh_processes > 1 ? "es" : "");
  else
    printf("  mesh            (not recorded: one device, one process)\n");
  char* model = st_json_dump(c->model, 0);
  printf("  model           %s\n", model);
  free(model);
  st__inspect_identity(c);
  printf("  files           %d, %s\n", c->file_count, size);
  for (int i = 0; i < c->file_count; ++i)
    printf("    %-24s %12zu bytes  xxh64 %016llx\n", c->files[i].file, c->files[i].bytes, (unsigned long long)c->files[i].xxh64);
  if (c->whole_count > 0)
    printf("  tensors         %d entries: %d tensors stored in rows, one file per rank (per-rank shards, layout \"rows\")\n",
           c->tensor_count, c->whole_count);
  else
    printf("  tensors         %d\n", c->tensor_count);
  printf("    %-36s %-22s %-6s %-18s %12s %16s\n", "name", "file", "dtype", "shape", "bytes", "xxh64");
  for (int i = 0; i < c->tensor_count; ++i) {
    const st_ckpt_tensor_info* t = &c->tensors[i];
    char ty[96];
    st_tensor_type_format(&t->type, ty, sizeof(ty));
    const char* br = strchr(ty, '[');
    /* Per-rank shards: which rows of the whole tensor the entry holds. */
    char name[600];
    if (t->rows)
      snprintf(name, sizeof(name), "%s[%lld:%lld of %lld]", t->name, (long long)t->row_begin, (long long)t->row_end, (long long)t->dim0);
    else
      snprintf(name, sizeof(name), "%s", t->name);
    printf("    %-36s %-22s %-6s %-18s %12zu %016llx\n", name, t->file, st_safetensors_dtype_name(t->type.dtype), br ? br : "[]",
           t->bytes, (unsigned long long)t->xxh64);
  }
  st_ckpt_free(c);
  return 0;
}

/* A checkpoint inside a run (<run>/checkpoints/step_N): its identity
 * against the run's config.yaml, by the check resume and eval make, and
 * what an older manifest does not record. Informational: never an error. */
static void st__inspect_identity(const st_ckpt* c) {
  char* yaml = st_rundir_path_above(c->dir, ST_RUNDIR_CONFIG);
  if (!st_fs_exists(yaml)) {
    free(yaml);
    return;
  }
  st_config* cfg = NULL;
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  st_status s = st_config_load(yaml, 0, NULL, &cfg);
  if (!s) s = st_plan_options_from_config(cfg, &o);
  json_t* report = NULL;
  if (!s) {
    char* manifest = st_path_join(c->dir, ST_CKPT_MANIFEST);
    st_plan_record rec = {.model = c->model, .tokenizer_hash = c->tokenizer_hash, .source = manifest, .label = "in the checkpoint"};
    char tok[65] = "";
    char* tj = st_rundir_path_above(c->dir, ST_RUNDIR_TOKENIZER);
    st_status ts = st_plan_given_tokenizer(&o, st_fs_exists(tj) ? tj : NULL, tok);
    st_status_free(ts);
    free(tj);
    s = st_plan_check_identity(&rec, &o, tok, NULL, "the run's config.yaml is not the model of this checkpoint", &report);
    free(manifest);
  }
  if (s) printf("  identity        %s\n", st_status_message(s));
  else printf("  identity        the model and tokenizer of %s\n", yaml);
  char* notes = report ? st_ckpt_identity_notes(report, "in the checkpoint") : NULL;
  if (notes && notes[0]) printf("                  %s\n", notes);
  free(notes);
  json_decref(report);
  st_status_free(s);
  st_plan_options_deinit(&o);
  st_config_destroy(cfg);
  free(yaml);
}

int st_cli_ckpt(int argc, char** argv) {
  bool json = false;
  const char* args[2] = {NULL, NULL};
  int n = 0;
  if (st_cli_json_args(argc, argv, kUsage, &json, args, 2, &n)) return 0;
  if (n != 2 || (strcmp(args[0], "list") && strcmp(args[0], "verify") && strcmp(args[0], "inspect")))
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  const char* cmd = args[0];
  char path[4096];
  snprintf(path, sizeof(path), "%s", args[1]);
  for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; --n) path[n - 1] = '\0';
  if (!st_fs_exists(path)) return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata ckpt %s: '%s' does not exist", cmd, path));
  if (!strcmp(cmd, "inspect")) return st__inspect(path, json);
  if (!strcmp(cmd, "verify") && st__is_ckpt_dir(path)) {
    st_ckpt* c = NULL;
    st_status s = st_ckpt_open(path, NULL, &c);
    if (s) return st_cli_report(s);
    char size[32];
    st__human_bytes((double)st__ckpt_bytes(c), size, sizeof(size));
    printf("OK %s: step %lld, %d tensors in %d files, %s, every checksum verified\n", c->dir, (long long)c->step, c->tensor_count,
           c->file_count, size);
    st_ckpt_free(c);
    return 0;
  }
  char* root = st__root_of(path);
  if (!root) return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata ckpt %s: '%s' is not a run directory or checkpoints folder", cmd, path));
  int total = 0;
  bool latest_bad = false;
  int bad = st__each(root, !strcmp(cmd, "verify"), &total, &latest_bad);
  int code = 0;
  if (!strcmp(cmd, "verify")) {
    if (latest_bad) {
      code = st_cli_report(st_status_make(ST_CODE_CKPT, "LATEST in %s names no checkpoint of it (see above)%s", root,
                                          bad ? "; invalid checkpoints too" : ""));
    } else if (bad) {
      code = st_cli_report(st_status_make(ST_CODE_CKPT, "%d of %d checkpoints in %s are invalid (reasons above)", bad, total, root));
    } else if (total == 0) {
      code = st_cli_report(st_status_make(ST_CODE_CKPT, "no checkpoints in %s", root));
    } else {
      printf("all %d checkpoints verified\n", total);
    }
  }
  free(root);
  return code;
}
