/* context.c — the task context of a run (context.json, docs/design.md §4):
 * enough to tell, months later, what ran where with which versions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/base.h"
#include "strata/obs.h"

/* First line of a command's output, or "" (the context is best effort:
 * a machine without git still trains). */
static void st__command_line(const char* cmd, char* out, size_t n) {
  out[0] = '\0';
  FILE* p = popen(cmd, "r");
  if (!p) return;
  if (fgets(out, (int)n, p)) out[strcspn(out, "\n")] = '\0';
  pclose(p);
}

static void st__proc_field(const char* file, const char* key, char* out, size_t n) {
  out[0] = '\0';
  FILE* f = fopen(file, "r");
  if (!f) return;
  char line[512];
  size_t klen = strlen(key);
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, key, klen) != 0) continue;
    char* colon = strchr(line, ':');
    if (!colon) continue;
    colon++;
    while (*colon == ' ' || *colon == '\t') colon++;
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(out, n, "%s", colon);
    break;
  }
  fclose(f);
}

static void st__kv(st_strbuf* b, const char* key, const char* value) {
  st_strbuf_printf(b, ", \"%s\": ", key);
  st_strbuf_json_string(b, value ? value : "");
}

char* st_context_json(const st_context_facts* f) {
  st_strbuf b = {0};
  st_strbuf_append(&b, "{\"schema\": 1");
  st__kv(&b, "run_id", f->run_id);
  st__kv(&b, "strata_version", STRATA_VERSION);
  char commit[128], dirty[256];
  st_strbuf cmd = {0};
  st_strbuf_printf(&cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", st_source_dir());
  st__command_line(cmd.data, commit, sizeof(commit));
  cmd.len = 0;
  st_strbuf_printf(&cmd, "git -C '%s' status --porcelain --untracked-files=no 2>/dev/null | head -1", st_source_dir());
  st__command_line(cmd.data, dirty, sizeof(dirty));
  st_strbuf_free(&cmd);
  st__kv(&b, "git_commit", commit);
  st_strbuf_printf(&b, ", \"git_dirty\": %s", commit[0] ? (dirty[0] ? "true" : "false") : "null");
  st__kv(&b, "jax_version", f->jax_version);
  st__kv(&b, "jaxlib_version", f->jaxlib_version);
  if (f->runtime) {
    st_runtime_info info;
    st_runtime_get_info(f->runtime, &info);
    st__kv(&b, "plugin_path", info.plugin_path);
    st__kv(&b, "plugin_xla_version", info.xla_version);
    st__kv(&b, "platform_name", info.platform_name);
    st__kv(&b, "platform_version", info.platform_version);
    st_strbuf_printf(&b, ", \"pjrt_api_version\": \"%d.%d\", \"devices\": [", info.api_major, info.api_minor);
    for (int i = 0; i < info.device_count; ++i) {
      st_device_info d;
      st_status s = st_runtime_device_info(f->runtime, i, &d);
      if (s) {
        st_status_free(s);
        continue;
      }
      st_strbuf_printf(&b, "%s{\"id\": %d, \"kind\": ", i ? ", " : "", d.id);
      st_strbuf_json_string(&b, d.kind ? d.kind : "");
      st_strbuf_append(&b, "}");
    }
    st_strbuf_append(&b, "]");
  }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  st__kv(&b, "host", host);
  char cpu[256];
  st__proc_field("/proc/cpuinfo", "model name", cpu, sizeof(cpu));
  st__kv(&b, "cpu_model", cpu);
  st_strbuf_printf(&b, ", \"cpu_cores\": %ld", sysconf(_SC_NPROCESSORS_ONLN));
  char mem[128];
  st__proc_field("/proc/meminfo", "MemTotal", mem, sizeof(mem));
  st__kv(&b, "memory", mem);
  /* The environment variables that change what strata or XLA does. */
  static const char* kEnv[] = {"XLA_FLAGS", "STRATA_PJRT_PLUGIN", "STRATA_CACHE_DIR", "STRATA_PYTHON", "PJRT_NPROC",
                               "JAX_PLATFORMS", "OMP_NUM_THREADS"};
  st_strbuf_append(&b, ", \"environment\": {");
  int n = 0;
  for (size_t i = 0; i < sizeof(kEnv) / sizeof(kEnv[0]); ++i) {
    const char* v = getenv(kEnv[i]);
    if (!v) continue;
    st_strbuf_printf(&b, "%s\"%s\": ", n++ ? ", " : "", kEnv[i]);
    st_strbuf_json_string(&b, v);
  }
  st_strbuf_append(&b, "}");
  st__kv(&b, "config_hash", f->config_hash);
  st__kv(&b, "bundle_key", f->bundle_key);
  st_strbuf_append(&b, "}");
  return b.data;
}
