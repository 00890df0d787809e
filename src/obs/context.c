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

json_t* st_context_json(const st_context_facts* f) {
  json_t* c = st_json_obj();
  st_json_put_int(c, "schema", 1);
  st_json_put_str(c, "run_id", f->run_id);
  st_json_put_str(c, "strata_version", STRATA_VERSION);
  char commit[128], dirty[256];
  st_strbuf cmd = {0};
  st_strbuf_printf(&cmd, "git -C '%s' rev-parse HEAD 2>/dev/null", st_source_dir());
  st__command_line(cmd.data, commit, sizeof(commit));
  cmd.len = 0;
  st_strbuf_printf(&cmd, "git -C '%s' status --porcelain --untracked-files=no 2>/dev/null | head -1", st_source_dir());
  st__command_line(cmd.data, dirty, sizeof(dirty));
  st_strbuf_free(&cmd);
  st_json_put_str(c, "git_commit", commit);
  st_json_put(c, "git_dirty", commit[0] ? st_json_bool(dirty[0] != '\0') : json_null());
  st_json_put_str(c, "jax_version", f->jax_version);
  st_json_put_str(c, "jaxlib_version", f->jaxlib_version);
  if (f->runtime) {
    st_runtime_info info;
    st_runtime_get_info(f->runtime, &info);
    st_json_put_str(c, "plugin_path", info.plugin_path);
    st_json_put_str(c, "plugin_xla_version", info.xla_version);
    st_json_put_str(c, "platform_name", info.platform_name);
    st_json_put_str(c, "platform_version", info.platform_version);
    char api[32];
    snprintf(api, sizeof(api), "%d.%d", info.api_major, info.api_minor);
    st_json_put_str(c, "pjrt_api_version", api);
    json_t* devices = st_json_arr();
    for (int i = 0; i < info.device_count; ++i) {
      st_device_info d;
      st_status s = st_runtime_device_info(f->runtime, i, &d);
      if (s) {
        st_status_free(s);
        continue;
      }
      json_t* dev = st_json_obj();
      st_json_put_int(dev, "id", d.id);
      st_json_put_str(dev, "kind", d.kind);
      st_json_push(devices, dev);
    }
    st_json_put(c, "devices", devices);
  }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  st_json_put_str(c, "host", host);
  char cpu[256];
  st__proc_field("/proc/cpuinfo", "model name", cpu, sizeof(cpu));
  st_json_put_str(c, "cpu_model", cpu);
  st_json_put_int(c, "cpu_cores", sysconf(_SC_NPROCESSORS_ONLN));
  char mem[128];
  st__proc_field("/proc/meminfo", "MemTotal", mem, sizeof(mem));
  st_json_put_str(c, "memory", mem);
  /* The environment variables that change what strata or XLA does. */
  static const char* kEnv[] = {"XLA_FLAGS", "STRATA_PJRT_PLUGIN", "STRATA_CACHE_DIR", "STRATA_PYTHON", "PJRT_NPROC",
                               "JAX_PLATFORMS", "OMP_NUM_THREADS"};
  json_t* env = st_json_obj();
  for (size_t i = 0; i < sizeof(kEnv) / sizeof(kEnv[0]); ++i) {
    const char* v = getenv(kEnv[i]);
    if (v) st_json_put_str(env, kEnv[i], v);
  }
  st_json_put(c, "environment", env);
  st_json_put_str(c, "config_hash", f->config_hash);
  st_json_put_str(c, "bundle_key", f->bundle_key);
  return c;
}
